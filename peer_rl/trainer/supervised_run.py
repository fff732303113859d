"""The supervised stages' launcher (driver side): `run_supervised(cfg, kind)` checks the rows and
the model, starts a Ray Train `TorchTrainer` whose `peer_rl.workers.supervised.train_loop` runs
on `trainer.world_size` FSDP2 ranks, resumes through Ray Train's own run snapshot, and copies
the newest checkpoint's model into `<trainer.output_dir>/final` (final.tmp, then rename) with the
wording the model was trained on (the judge's template, the policy's instruction)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


from peer_rl.config.schema import ConfigError, save_config
from peer_rl.config.worker_settings import LoRASettings
from peer_rl.log import progress_bar
from peer_rl.files.out_paths import (claim_run_dir, read_json, release_unwritten, staged_dir,
                                     write_atomic)
from peer_rl.models.local import check_model_dir
from peer_rl.models.pinned import card_files, check_languages
from peer_rl.prompts.judge import JudgeTemplate, TemplateError, check_rows
from peer_rl.supervised.config import JUDGE_KINDS, TrainLoopConfig
from peer_rl.supervised.examples import example_view, load_examples, load_rows, steps_per_epoch
from peer_rl.supervised.tiny_models import (default_cache_dir, ensure_tiny_models,
                                            ensure_tiny_reward_model)
from peer_rl.trainer.runtime import init_ray, quiet_driver
from peer_rl.workers.supervised import (RUN_NAME, STATE_FILE, TRAIN_TIME_FILE, image_token_counter,
                                       train_loop, vision_inputs)

log = logging.getLogger(__name__)


class StepBar:
    """The driver's progress bar of a supervised run, read off the metrics.jsonl rank 0 writes
    every trainer.log_freq steps: without logging.verbose the workers print no step lines
    (Ray would prefix each with its process), so this is what the console shows."""

    def __init__(self, metrics: Path, total: int, name: str, poll_s: float = 1.0):
        self.metrics, self.total, self.name, self.poll_s = metrics, total, name, poll_s
        self.stop, self.thread, self.bar = threading.Event(), None, None

    def latest(self) -> dict | None:
        """The newest record (None before the first); a line being written is skipped."""
        try:
            lines = self.metrics.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return None
        for line in reversed(lines):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
        return None

    def _show(self) -> None:
        rec = self.latest()
        if rec is not None and int(rec["step"]) != self.bar.n:   # a log file gets one line each
            self.bar.n = min(int(rec["step"]), self.total)
            self.bar.set_postfix(loss=f"{rec.get('loss', float('nan')):.4f}", refresh=False)
            self.bar.refresh()

    def _poll(self) -> None:
        while not self.stop.wait(self.poll_s):
            self._show()

    def __enter__(self):
        self.bar = progress_bar(total=self.total, desc=self.name, unit="step")
        self.thread = threading.Thread(target=self._poll, daemon=True, name="step-bar")
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self._show()
        self.bar.close()
        return False


def resolve_model(cfg, kind: str) -> str:
    """model.path, or the tiny random model of this stage: judge for train-rm, policy for sft."""
    path = cfg.model.path
    if not path:
        # same cache location as peer_rl.trainer.run.resolve_models, so all stages share one build
        cache = cfg.model.tiny_cache_dir or default_cache_dir()
        if kind == "bt":
            path = ensure_tiny_reward_model(cache)
        else:
            path = ensure_tiny_models(cache)["policy" if kind == "sft" else "judge"]

    check_model_dir(f"model.path={path!r}", path)
    return str(Path(path).resolve())


def check_row_languages(cfg, model_path: str, root: Path) -> None:
    """peer_rl.trainer.run.check_languages on the rows this stage would train on."""
    from peer_rl.data.loading import row_language  # deferred: pulls in datasets

    found = Counter()
    for rel in cfg.data.train_files:
        _, ds, _, _ = load_rows(root, rel, cfg.data.skip_invalid, cfg.data.languages)
        found.update(row_language(r) for r in ds)
    check_languages(found, model_path, "model.path")


def judge_template_text(cfg, model_path: str, examples_root: Path) -> str:
    """The template the judge is trained with and saved beside (judge.template, else the one
    saved with the starting model, else the built-in one), checked against every SER row it
    trains on: a row the template cannot reproduce is a chat shaped unlike anything the RL-time
    judge will be shown. strict stops here, before anything is written."""
    from peer_rl.data.loading import located_ser_rows  # deferred: pulls in datasets

    source = cfg.judge.template or str(Path(model_path) / "judge_template.json")
    try:
        template = (JudgeTemplate.from_file(cfg.judge.template) if cfg.judge.template
                    else JudgeTemplate.load(model_path))
    except TemplateError as exc:
        raise TemplateMismatch(str(exc)) from exc
    if not (cfg.judge.template or Path(source).exists()):
        source = "the built-in template"
    if cfg.judge.template_check != "off":
        rows = located_ser_rows(examples_root, cfg.data.train_files, cfg.data.skip_invalid)
        if cfg.data.max_rows:
            rows = rows[:cfg.data.max_rows]
        report = check_rows(template, rows)
        if report.mismatched:
            advice = ("fit a template to these rows with `peer-rl judge-template fit "
                      f"{examples_root} --out judge_template.json` and pass "
                      "judge.template=judge_template.json, or train anyway with "
                      "judge.template_check=warn")
            msg = f"{report.summary()}\n(template: {source})"
            if cfg.judge.template_check == "strict":
                raise TemplateMismatch(f"{msg}\nThe RL-time judge is asked through this "
                                       f"template; {advice}.")
            log.info(f"warning (judge.template_check=warn): {msg}")
        else:
            log.info(f"judge template ({source}): all {report.checked} SER row(s) match")
    return template.with_role(JUDGE_KINDS[cfg.kind]).dumps()


def sft_policy_template(cfg, model_path: str, root: Path) -> dict[str, str]:
    """{policy_template.json: text} for the SFT'd policy: the starting model's template (else the
    built-in one), held against the sft/ rows' prompts; rows worded otherwise are counted and
    reported (the policy still learns from them, but an evaluation will not ask it so)."""
    # deferred: TEMPLATE_FILE is bound otherwise here
    from peer_rl.prompts.policy import TEMPLATE_FILE, PolicyTemplate

    template = PolicyTemplate.load(model_path)
    checked, differ = 0, 0
    for rel in cfg.data.train_files:
        if Path(rel).parts[0] != "sft":
            continue                    # cold_start/: the ESCRAG-R1 prompt, not this template
        _, ds, _, _ = load_rows(root, rel, cfg.data.skip_invalid, cfg.data.languages)
        for row in ds:
            checked += 1
            differ += not template.reads(row["messages"], row["language"],
                                         bool(row.get("images")))
    if not checked:
        return {}
    if differ:
        log.info(f"warning: {differ}/{checked} sft prompt(s) are worded unlike the policy template "
                 f"({template.source}) saved with the model, which the evaluations build prompts "
                 "from; GRPO reads its own template off its rows")
    else:
        log.info(f"policy prompt ({template.source}): all {checked} sft prompt(s) match")
    return {TEMPLATE_FILE: template.dumps()}


class TemplateMismatch(ValueError):
    """SER rows the judge template cannot reproduce, or an unusable template file."""


def _export_final(ckpt_dir: Path, out: Path) -> Path:
    """<out>/final from a checkpoint's model/: written beside, then swapped in whole
    (peer_rl.files.out_paths.staged_dir), so a reader never meets half of either."""
    with staged_dir(out / "final") as tmp:
        shutil.copytree(ckpt_dir / "model", tmp, dirs_exist_ok=True)
        (tmp / STATE_FILE).write_text((ckpt_dir / STATE_FILE).read_text(encoding="utf-8"),
                                      encoding="utf-8")
    return out / "final"


@dataclass
class StagePlan:
    """What a supervised stage's ranks are given, decided and checked before anything is
    written: the worker config (`peer_rl.workers.supervised.train_loop` reads its own examples
    from it) and the driver's reading of the rows."""
    model_path: str
    root: Path
    extra: dict            # files saved beside the model: the template it was trained with
    total: int             # optimizer steps
    summary: dict          # load_examples' counts
    worker: TrainLoopConfig  # what every rank is given (loop_config)
    examples_sha256: str   # the token ids and labels the ranks will train on


def plan_stage(cfg, kind: str) -> StagePlan:
    """The model, the rows and the worker config of one supervised stage (no file written)."""
    from transformers import AutoTokenizer  # deferred: transformers (~3 s, pulls in torch)

    from peer_rl.data.bundled import sample_root  # deferred: pulls in PIL

    root = Path(cfg.data.root).resolve() if cfg.data.root else sample_root()
    model_path = resolve_model(cfg, kind)
    extra = {}
    if kind in JUDGE_KINDS:     # checked before anything is written
        # deferred: TEMPLATE_FILE is bound otherwise here
        from peer_rl.prompts.judge import TEMPLATE_FILE

        extra[TEMPLATE_FILE] = judge_template_text(cfg, model_path, root)
    elif kind == "sft":
        extra.update(sft_policy_template(cfg, model_path, root))
    check_row_languages(cfg, model_path, root)
    extra.update(card_files(model_path))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    t0 = time.perf_counter()
    vision = None if kind == "bt" else vision_inputs(model_path)
    if kind == "bt":
        from peer_rl.supervised.bradley_terry import load_pairs  # deferred: pulls in torch

        examples, summary = load_pairs(root, list(cfg.data.train_files), tokenizer,
                                       cfg.trainer.max_length, cfg.data.skip_invalid,
                                       cfg.data.max_rows)
        what = "preference pair(s)"
    else:
        examples, summary = load_examples(root, list(cfg.data.train_files), tokenizer,
                                          cfg.trainer.max_length, cfg.data.skip_invalid,
                                          cfg.data.max_rows,
                                          image_tokens=image_token_counter(vision),
                                          languages=cfg.data.languages,
                                          verdict_balance=cfg.trainer.verdict_balance,
                                          **example_view(kind, extra))
        what = f"example(s) ({summary['target_tokens']} target tokens)"
        if summary["unreadable"]:
            what += (f"; {summary['unreadable']} SER row(s) skipped: the template cannot read "
                     "their history and replies for the outcome model")
    total = cfg.trainer.total_steps or cfg.trainer.epochs * steps_per_epoch(len(examples),
                                                                            cfg.trainer.batch_size)
    log.info(f"model {model_path}; data {root}: {summary['examples']} {what}; "
             f"{summary['too_long']} dropped as longer than max_length={cfg.trainer.max_length}; "
             f"{summary['invalid']} invalid skipped; "
             + (f"left out by data.languages: {summary['other_languages']}; "
                if summary.get("other_languages") else "")
             + f"read in {time.perf_counter() - t0:.1f} s; "
             f"{total} step(s) of {cfg.trainer.batch_size}")
    if summary.get("verdicts"):
        log.info("verdicts weighted by class (trainer.verdict_balance): " + "; ".join(
                f"turn {pos + 1}: " + ", ".join(f"{label[:24]!r} x{n} w{w:.2f}"
                                                for label, (n, w) in sorted(labels.items()))
                for pos, labels in sorted(summary["verdicts"].items())))
    if summary.get("with_images"):
        log.info(f"{summary['with_images']} row(s) have images: " + (
                "trained with them (SER: in the Step 2 round; sft: in the prompt)" if vision
                else "the model is text-only, so they are trained on their words alone"))
    worker = loop_config(cfg, kind, model_path, root, extra, int(total))
    return StagePlan(model_path, root, extra, int(total), summary, worker,
                     examples_sha256(examples))


def loop_config(cfg, kind: str, model_path: str, root: Path, extra: dict,
                total: int) -> TrainLoopConfig:
    """The one place a stage's config becomes what its ranks are given."""
    import torch  # deferred: torch (~2 s); the CLI starts without it

    lora = cfg.model.lora
    return TrainLoopConfig(
        kind=kind, train_files=tuple(cfg.data.train_files), skip_invalid=cfg.data.skip_invalid,
        max_rows=cfg.data.max_rows, max_length=cfg.trainer.max_length,
        languages=tuple(cfg.data.languages), batch_size=cfg.trainer.batch_size,
        micro_batch_size=cfg.trainer.micro_batch_size, total_steps=total, lr=cfg.trainer.lr,
        lr_scheduler=cfg.trainer.lr_scheduler, warmup_steps=cfg.trainer.warmup_steps,
        min_lr_ratio=cfg.trainer.min_lr_ratio, weight_decay=cfg.trainer.weight_decay,
        grad_clip=cfg.trainer.grad_clip, save_freq=cfg.trainer.save_freq,
        log_freq=cfg.trainer.log_freq, seed=cfg.trainer.seed, dtype=cfg.trainer.dtype,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        freeze_vision_tower=cfg.model.freeze_vision_tower, extra_files=dict(extra),
        verdict_balance=bool(cfg.trainer.verdict_balance),
        lora=LoRASettings(rank=lora.rank, lora_alpha=lora.lora_alpha,
                          target_modules=list(lora.target_modules),
                          lora_adapter_path=lora.lora_adapter_path),
        model_path=model_path, data_root=str(root),
        output_dir=str(Path(cfg.trainer.output_dir).resolve()),
        verbose=bool(cfg.logging.verbose), cpus_per_worker=cfg.resources.cpus_per_worker,
        use_gpu=cfg.resources.gpus_per_worker > 0 or torch.cuda.is_available())


def examples_sha256(examples: list[dict]) -> str:
    """One digest of what a stage trains on: every example's fields but its id and image paths
    (the images' bytes are the data's), in order."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps({k: v for k, v in ex.items() if k not in ("id", "images")},
                            sort_keys=True, default=str).encode())
        h.update(str(len(ex.get("images") or ())).encode())
    return h.hexdigest()


def run_supervised(cfg, kind: str) -> Path:
    """Run one supervised stage end to end; returns <trainer.output_dir>/final."""
    if cfg.kind != kind:
        raise ConfigError(f"recipe {cfg.recipe!r} has kind={cfg.kind!r}, expected {kind!r}")
    if not cfg.logging.verbose:
        quiet_driver()
    out = Path(cfg.trainer.output_dir).resolve()
    storage = out / "ray_train"
    if cfg.resume == "disable" and (storage / RUN_NAME).exists():
        raise ConfigError(f"resume=disable: {storage / RUN_NAME} already holds a run; pass "
                          "resume=auto to continue it or choose another trainer.output_dir")
    stage = "sft" if kind == "sft" else "train-rm"
    # the resume=disable check above has refused a run there to replace; locked while it runs
    created = not out.exists()
    lock = claim_run_dir(out, stage, [cfg.data.root, cfg.model.path,
                                      cfg.model.lora.lora_adapter_path])
    try:
        return _run_stage(cfg, kind, out, storage, stage)
    except BaseException:
        if created:             # refused before writing (a template mismatch, bad rows)
            release_unwritten(out)
        raise
    finally:
        lock.close()


def _run_stage(cfg, kind: str, out: Path, storage: Path, stage: str) -> Path:
    """The stage, in the output directory run_supervised has claimed and locked."""
    from ray.train import (CheckpointConfig, FailureConfig, LoggingConfig, RunConfig,
                           ScalingConfig)  # deferred: ray
    from ray.train.torch import TorchTrainer  # deferred: ray

    log.info(f"{stage}: recipe={cfg.recipe} kind={kind} output_dir={out}")
    plan = plan_stage(cfg, kind)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    total, use_gpu = plan.total, plan.worker.use_gpu
    resources = {"CPU": float(cfg.resources.cpus_per_worker)}
    if use_gpu:
        resources["GPU"] = float(cfg.resources.gpus_per_worker or 1)
    # Ray Train V2 routes worker print() through its logger; with Ray's own stdout capture that
    # doubles every line, and dill (datasets' fingerprinting) then leaks disassembly it meant to
    # capture. Propagated to the controller and workers (ray/train/v2/_internal/constants.py).
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    # Ray Train's preemption watcher only observes (a lost node fails the attempt either way,
    # and FailureConfig retries it); its start-up prints an error line from Ray's core worker
    # about its constructor arguments on every run
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    import ray  # deferred: ray (~1 s); commands that start no cluster run without it

    started_ray = not ray.is_initialized()
    init_ray(cfg, dashboard=True)
    trainer = TorchTrainer(
        train_loop, train_loop_config=plan.worker,
        scaling_config=ScalingConfig(num_workers=cfg.trainer.world_size, use_gpu=use_gpu,
                                     resources_per_worker=resources),
        run_config=RunConfig(
            name=RUN_NAME, storage_path=str(storage),
            worker_runtime_env={"env_vars": {"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
                                             "TOKENIZERS_PARALLELISM": "false"}},
            failure_config=FailureConfig(max_failures=cfg.trainer.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.trainer.keep_checkpoints),
            # Ray Train's own progress lines (worker group started, checkpoint reported) only
            # with logging.verbose; peer-rl's step lines and every warning stay
            logging_config=LoggingConfig("INFO" if cfg.logging.verbose else "WARNING")),
    )
    t0 = time.perf_counter()
    bar = None if cfg.logging.verbose else StepBar(out / "metrics.jsonl", int(total),
                                                   "train-rm" if kind in JUDGE_KINDS else kind)
    try:
        with bar or contextlib.nullcontext():
            result = trainer.fit()
        if result.error:
            raise result.error
        if result.checkpoint is None:
            raise RuntimeError(f"{storage / RUN_NAME}: the run reported no checkpoint")
        with result.checkpoint.as_directory() as d:
            final = _export_final(Path(d), out)
    finally:
        if started_ray:          # a local cluster this call started; also flushes worker logs
            ray.shutdown()

    state = read_json(final / STATE_FILE, "trainer state")
    if state["step"] < total:
        raise RuntimeError(f"the newest checkpoint is step {state['step']} < {total}")
    log.info(f"done: {state['step']} step(s) in {time.perf_counter() - t0:.0f} s")
    log.info(f"output directory: {out} (model: {final})")
    write_atomic(final / TRAIN_TIME_FILE, json.dumps(     # `eval rm` reads it
        {"seconds": round(time.perf_counter() - t0, 1), "steps": state["step"], "kind": kind,
         "world_size": cfg.trainer.world_size}))
    if kind == "rm":
        log.info(f"score the judge: peer-rl eval rm --model {final} --out {out / 'eval_rm.json'}")
    if kind in ("prm", "orm"):
        log.info(f"score the pair: peer-rl eval rm --prm <prm>/final --orm <orm>/final --out "
                 f"{out / 'eval_rm.json'}")
    if kind == "bt":
        log.info(f"score the reward model: peer-rl eval pairs --model {final}")
    return final
