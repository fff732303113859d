"""Supervised fine-tuning with Ray Train: `peer-rl train-rm` (UnifiReward on SER) and `peer-rl sft`.

`run_supervised(cfg, kind)` is the launcher (driver side): it starts a Ray Train `TorchTrainer`
(Train V2, Ray's default since 2.5x) whose `train_loop` runs on `trainer.world_size` workers,
each an FSDP2 rank (`fully_shard` per decoder layer, then the root; gloo on CPU, nccl on GPU; Ray
Train sets up the process group). When it finishes, the driver copies the newest checkpoint's
model into `<trainer.output_dir>/final` (final.tmp, then rename), with the judge prompt template
for a reward model.

Checkpoints (every trainer.save_freq steps and at the end), reported with
`ray.train.report(..., checkpoint=...)` and merged by Ray Train into
`<output_dir>/ray_train/run/step_N/`:
    model/                HF format, fp32 master weights, safetensors (rank 0)
    optim/                AdamW state, torch.distributed.checkpoint shards in safetensors
                          files (every rank writes its slices; loadable at another world size)
    trainer_state.json    step, examples, world size (rank 0)
Nothing is unpickled on load. Resuming is Ray Train's own mechanism: a new run with the same
RunConfig(storage_path, name) reloads the run snapshot and `ray.train.get_checkpoint()` returns
the newest checkpoint, in a restarted worker group (FailureConfig.max_failures) or in a later
`peer-rl train-rm`/`sft` call on the same output_dir (`resume=auto`, the default). The data order
is a function of (seed, step), so a resumed run sees the batches an uninterrupted one would.

Loss: token-mean cross-entropy over the target tokens of the whole global batch (labels from
peer_rl.supervised, -100 on prompt tokens), so world_size 1 and 2 take the same step.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
RUN_NAME = "run"                 # RunConfig(name); storage_path = <output_dir>/ray_train
STATE_FILE = "trainer_state.json"
TRAIN_TIME_FILE = "train_time.json"    # wall seconds of the Ray Train run that made final/


def _log(msg: str) -> None:
    print(f"[peer-rl] {msg}", flush=True)


# ============================================================================ worker side
def _load_model(path: str, gradient_checkpointing: bool, freeze_vision: bool):
    import torch

    from workers import fsdp

    model = fsdp.load_pretrained(path)
    if freeze_vision and fsdp.vision_tower(model) is not None:
        fsdp.freeze_vision_tower(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    if not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        model.eval()   # no dropout anywhere: eval mode is identical and skips train-only paths
    return model


def vision_inputs(model_path: str):
    """workers.vision.VisionInputs for a vision-language checkpoint, None for a text model."""
    from workers import fsdp

    if not fsdp.is_vision_language(model_path):
        return None
    from workers.vision import VisionInputs

    return VisionInputs(model_path)


def image_token_counter(vision):
    """(image token id, path -> tokens) for peer_rl.supervised.build_examples, or None."""
    if vision is None:
        return None
    return vision.image_token_id, lambda path: vision.tokens(path)


def _save_checkpoint(directory: Path, model, optim, rank: int, world_size: int, src_dir: str,
                     state: dict, extra_files: dict[str, str], drop: set[str]) -> None:
    """Collective. Rank 0: model/ (HF, safetensors) + trainer_state.json; every rank: its
    slices of the AdamW state (optim/, workers.fsdp.save_sharded: loadable at another world
    size)."""
    import torch.distributed as dist

    from workers import fsdp

    sd = fsdp.full_state_dict(model)
    if rank == 0:
        mdir = directory / "model"
        fsdp.copy_model_files(src_dir, mdir)
        for name, text in extra_files.items():
            (mdir / name).write_text(text, encoding="utf-8")
        sd = {k: v for k, v in sd.items() if k not in drop}
        model.save_pretrained(mdir, state_dict=sd, max_shard_size="5GB")
        (directory / STATE_FILE).write_text(json.dumps(state, indent=1), encoding="utf-8")
    del sd
    fsdp.save_sharded(directory / "optim", model, optim, rank, include_model=False)
    dist.barrier()


def train_loop(config: dict) -> None:
    """Ray Train worker function (one FSDP2 rank). `config` is plain data from run_supervised."""
    import ray.train
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from ray.train import Checkpoint
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoTokenizer

    from workers import fsdp

    from peer_rl.bradley_terry import collate_pairs, load_pairs
    from peer_rl.metrics import MetricsSink
    from peer_rl.supervised import (batch_indices, collate, count_targets, load_examples,
                                    lr_schedule, rank_rows)

    ctx = ray.train.get_context()
    rank, ws = ctx.get_world_rank(), ctx.get_world_size()
    use_cuda = torch.cuda.is_available() and config["use_gpu"]
    if use_cuda:
        import ray.train.torch as rtt
        device = rtt.get_device()
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, int(config["cpus_per_worker"])))
    if not dist.is_initialized():   # world_size 1 still goes through the same code path
        raise RuntimeError("Ray Train did not set up torch.distributed")
    mesh = init_device_mesh(device.type, (ws,))
    torch.manual_seed(config["seed"])

    # ---- data: every rank tokenizes the same files (deterministic) and takes its rows per step
    tokenizer = AutoTokenizer.from_pretrained(config["model_path"])
    bt = config["kind"] == "bt"      # pairs + Bradley-Terry loss; else token cross-entropy
    vision = None if bt else vision_inputs(config["model_path"])
    if bt:
        examples, _ = load_pairs(config["data_root"], config["train_files"], tokenizer,
                                 config["max_length"], config["skip_invalid"], config["max_rows"])
    else:
        examples, _ = load_examples(config["data_root"], config["train_files"], tokenizer,
                                    config["max_length"], config["skip_invalid"],
                                    config["max_rows"], image_tokens=image_token_counter(vision),
                                    languages=config["languages"],
                                    **_view(config["kind"], config["extra_files"]))
    n, bs, micro, total = len(examples), config["batch_size"], config["micro_batch_size"], config["total_steps"]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    # ---- model: from the newest checkpoint (resume) or from model_path
    start_step, src = 0, config["model_path"]
    ckpt = ray.train.get_checkpoint()
    ckpt_dir = None
    if ckpt is not None:
        ckpt_dir = Path(ckpt.path) if ckpt.filesystem.type_name == "local" else None
        if ckpt_dir is None:                    # remote storage: download once per rank
            ckpt_dir = Path(ckpt.to_directory(tempfile.mkdtemp(prefix="peer-rl-ckpt-")))
        state = json.loads((ckpt_dir / STATE_FILE).read_text(encoding="utf-8"))
        start_step, src = int(state["step"]), str(ckpt_dir / "model")
    mp = fsdp.mixed_precision(device, config["bf16"])
    # loaded on the host; fully_shard moves each rank's shard to the mesh's device
    model = _load_model(src, config["gradient_checkpointing"], config["freeze_vision_tower"])
    tied = set(fsdp.tied_duplicates(model))
    model = fsdp.shard(model, mesh, mp)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                              lr=config["lr"], weight_decay=config["weight_decay"])
    if ckpt_dir is not None:
        fsdp.load_sharded(ckpt_dir / "optim", model, optim, include_model=False)
        if rank == 0:
            _log(f"resumed from {ckpt_dir.name} (step {start_step}/{total})")
    if rank == 0:
        _log(f"{ws} rank(s), {dist.get_backend()} on {device.type}; {n} examples; "
             f"steps {start_step + 1}..{total}")

    sink = None       # rank 0 writes metrics.jsonl (and TensorBoard), as the RL runs do
    if rank == 0:
        Path(config["output_dir"]).mkdir(parents=True, exist_ok=True)
        sink = MetricsSink(Path(config["output_dir"]), ["jsonl", "tensorboard"],
                           resume_step=start_step if ckpt_dir is not None else None)
    sched = lr_schedule(optim, config["lr"], total, config["warmup_steps"],
                        config["lr_scheduler"], config["min_lr_ratio"], start_step)

    window = {"loss": 0.0, "tokens": 0.0, "steps": 0, "grad_norm": 0.0, "t0": time.perf_counter()}
    last: dict = {}
    for step in range(start_step, total):
        idx = batch_indices(n, bs, step, config["seed"])
        rows, real = rank_rows(idx, rank, ws)
        # the loss is a mean over the global batch: target tokens (sft, rm) or pairs (bt)
        global_tokens = len(idx) if bt else max(1, sum(count_targets(examples[i]) for i in idx))
        lr = optim.param_groups[0]["lr"]
        optim.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64)
        right = torch.zeros((), dtype=torch.float64)       # bt: pairs scored the right way
        for k in range(0, len(rows), micro):
            chunk = [examples[i] for i in rows[k:k + micro]]
            if bt:
                ok = torch.tensor(real[k:k + micro], dtype=torch.float32, device=device)
                batch = {key: v.to(device) for key, v in collate_pairs(chunk, pad_id).items()}
                scores = model(**batch, use_cache=False).logits[:, 0].float()
                margin = scores[:len(chunk)] - scores[len(chunk):]
                nll = (-F.logsigmoid(margin) * ok).sum()     # rank padding pairs weigh 0
                (nll * (ws / global_tokens)).backward()
                loss_sum += nll.detach().double().cpu()
                right += (((margin > 0).float() + 0.5 * (margin == 0).float()) * ok).sum() \
                    .detach().double().cpu()
                continue
            batch = collate(chunk, pad_id, real[k:k + micro])
            extra = {}
            if vision is not None:     # the frames of visual rows (workers.vision)
                extra = vision(batch["input_ids"], [e["images"] for e in chunk])
            batch = {key: v.to(device) for key, v in (batch | extra).items()}
            # logits only where some row has a target (the lm_head over the vocabulary is the
            # largest matmul of a small model, and SER chats have ~10 target tokens in ~500)
            targets = batch["labels"][:, 1:]
            keep = (targets != -100).any(0).nonzero().squeeze(1)
            if keep.numel() == 0:               # padding rows only: same graph, zero loss
                keep = torch.zeros(1, dtype=torch.long, device=device)
            logits = model(**{k: v for k, v in batch.items() if k != "labels"},
                           use_cache=False, logits_to_keep=keep).logits.float()
            ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                 targets[:, keep].reshape(-1), ignore_index=-100,
                                 reduction="sum")
            # share of the global token-mean; x ws undoes FSDP's averaging of gradients over ranks
            (ce * (ws / global_tokens)).backward()
            loss_sum += ce.detach().double().cpu()
        norm, _ = fsdp.clip_and_step(model, optim, config["grad_clip"], ws)
        sched.step()
        red = torch.stack([loss_sum, right]).to(device)
        dist.all_reduce(red)
        loss = float(red[0]) / global_tokens
        window["acc"] = window.get("acc", 0.0) + float(red[1]) / global_tokens
        window["loss"] += loss
        window["tokens"] += global_tokens
        window["steps"] += 1
        window["grad_norm"] += norm
        done = step + 1
        is_save = done == total or (config["save_freq"] and done % config["save_freq"] == 0)
        if done % config["log_freq"] == 0 or is_save or done == start_step + 1:
            dt = time.perf_counter() - window["t0"]
            last = {"step": done, "loss": window["loss"] / window["steps"], "lr": lr,
                    "grad_norm": window["grad_norm"] / window["steps"],
                    "target_tokens_per_s": window["tokens"] / max(dt, 1e-9),
                    "epoch": step * bs / n, "resumed_from_step": start_step}
            if bt:   # tokens/s means pairs/s here; the train pairwise accuracy of the window
                last["pairwise_accuracy"] = window.get("acc", 0.0) / window["steps"]
            if rank == 0:
                rate = (f"{last['target_tokens_per_s']:.1f} pairs/s train acc "
                        f"{last['pairwise_accuracy']:.3f}" if bt else
                        f"{last['target_tokens_per_s']:.0f} target tok/s")
                _log(f"step {done}/{total} loss {last['loss']:.4f} lr {lr:.2e} "
                     f"grad_norm {last['grad_norm']:.3f} {rate}")
                sink.log(done, {k: v for k, v in last.items() if k != "step"})
            window = {"loss": 0.0, "tokens": 0.0, "steps": 0, "grad_norm": 0.0, "acc": 0.0,
                      "t0": time.perf_counter()}
        if is_save:
            tmp = Path(tempfile.mkdtemp(prefix=f"peer-rl-step{done}-"))
            try:
                state = {"step": done, "total_steps": total, "world_size": ws, "examples": n,
                         "kind": config["kind"], "loss": last.get("loss")}
                _save_checkpoint(tmp, model, optim, rank, ws, config["model_path"], state,
                                 config["extra_files"], tied)
                ray.train.report({**last, "step": done}, checkpoint=Checkpoint.from_directory(str(tmp)),
                                 checkpoint_dir_name=f"step_{done:06d}")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    if sink is not None:
        sink.close()


# ============================================================================ driver side
def resolve_model(cfg, kind: str) -> str:
    """model.path, or the tiny random model of this stage: judge for train-rm, policy for sft."""
    path = cfg.model.path
    if not path:
        from peer_rl.tiny_models import default_cache_dir, ensure_tiny_models

        # same cache location as peer_rl.train.resolve_models, so all stages share one build
        cache = cfg.model.tiny_cache_dir or default_cache_dir()
        if kind == "bt":
            from peer_rl.tiny_models import ensure_tiny_reward_model

            path = ensure_tiny_reward_model(cache)
        else:
            path = ensure_tiny_models(cache)["policy" if kind == "sft" else "judge"]
    from peer_rl.pinned_models import ensure_model

    if not Path(ensure_model(path), "config.json").exists():
        raise FileNotFoundError(f"model.path={path!r}: no config.json there (expected an HF "
                                "model directory)")
    return str(Path(path).resolve())


def check_row_languages(cfg, model_path: str, root: Path) -> None:
    """peer_rl.train.check_languages on the rows this stage would train on."""
    from collections import Counter

    from peer_rl.data.loading import row_language
    from peer_rl.pinned_models import check_languages
    from peer_rl.supervised import load_rows

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
    from peer_rl.config_supervised import JUDGE_KINDS
    from peer_rl.judge_prompt import JudgeTemplate, TemplateError, check_rows
    from peer_rl.judge_template_fit import located_ser_rows

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
            _log(f"warning (judge.template_check=warn): {msg}")
        else:
            _log(f"judge template ({source}): all {report.checked} SER row(s) match")
    return template.with_role(JUDGE_KINDS[cfg.kind]).dumps()


def _view(kind: str, extra_files: dict) -> dict:
    """load_examples' view arguments for a judge kind (the template read from its JSON)."""
    from peer_rl.config_supervised import JUDGE_KINDS
    from peer_rl.judge_prompt import TEMPLATE_FILE, JudgeTemplate

    if kind not in JUDGE_KINDS or JUDGE_KINDS[kind] == "unified":
        return {}
    raw = json.loads(extra_files[TEMPLATE_FILE])
    return {"view": JUDGE_KINDS[kind], "template": JudgeTemplate(text=raw["text"])}


def sft_policy_template(cfg, model_path: str, root: Path) -> dict[str, str]:
    """{policy_template.json: text} for the SFT'd policy: the starting model's template (else the
    built-in one), held against the sft/ rows' prompts; rows worded otherwise are counted and
    reported (the policy still learns from them, but an evaluation will not ask it so)."""
    from peer_rl.policy_prompt import TEMPLATE_FILE, PolicyTemplate
    from peer_rl.supervised import load_rows

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
        _log(f"warning: {differ}/{checked} sft prompt(s) are worded unlike the policy template "
             f"({template.source}) saved with the model, which the evaluations build prompts "
             "from; GRPO reads its own template off its rows")
    else:
        _log(f"policy prompt ({template.source}): all {checked} sft prompt(s) match")
    return {TEMPLATE_FILE: template.dumps()}


class TemplateMismatch(ValueError):
    """SER rows the judge template cannot reproduce, or an unusable template file."""


def _export_final(ckpt_dir: Path, out: Path) -> Path:
    """<out>/final from a checkpoint's model/: written to final.tmp, then renamed into place."""
    final, tmp, old = out / "final", out / "final.tmp", out / "final.old"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ckpt_dir / "model", tmp)
    (tmp / STATE_FILE).write_text((ckpt_dir / STATE_FILE).read_text(encoding="utf-8"),
                                  encoding="utf-8")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def run_supervised(cfg, kind: str) -> Path:
    """Run one supervised stage end to end; returns <trainer.output_dir>/final."""
    import torch
    from ray.train import (CheckpointConfig, FailureConfig, LoggingConfig, RunConfig,
                           ScalingConfig)
    from ray.train.torch import TorchTrainer
    from transformers import AutoTokenizer

    from peer_rl.config import ConfigError, save_config
    from peer_rl.config_supervised import JUDGE_KINDS
    from peer_rl.data.sample import sample_root
    from peer_rl.supervised import load_examples, steps_per_epoch
    from peer_rl.runtime import init_ray

    if cfg.kind != kind:
        raise ConfigError(f"recipe {cfg.recipe!r} has kind={cfg.kind!r}, expected {kind!r}")
    out = Path(cfg.trainer.output_dir).resolve()
    storage = out / "ray_train"
    if cfg.resume == "disable" and (storage / RUN_NAME).exists():
        raise ConfigError(f"resume=disable: {storage / RUN_NAME} already holds a run; pass "
                          "resume=auto to continue it or choose another trainer.output_dir")
    _log(f"{'sft' if kind == 'sft' else 'train-rm'}: recipe={cfg.recipe} kind={kind} "
         f"output_dir={out}")
    root = Path(cfg.data.root).resolve() if cfg.data.root else sample_root()
    model_path = resolve_model(cfg, kind)
    extra = {}
    if kind in JUDGE_KINDS:     # checked before anything is written
        from peer_rl.judge_prompt import TEMPLATE_FILE

        extra[TEMPLATE_FILE] = judge_template_text(cfg, model_path, root)
    elif kind == "sft":
        extra.update(sft_policy_template(cfg, model_path, root))
    from peer_rl.pinned_models import card_files

    check_row_languages(cfg, model_path, root)
    extra.update(card_files(model_path))
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    t0 = time.perf_counter()
    vision = None if kind == "bt" else vision_inputs(model_path)
    if kind == "bt":
        from peer_rl.bradley_terry import load_pairs

        examples, summary = load_pairs(root, list(cfg.data.train_files), tokenizer,
                                       cfg.trainer.max_length, cfg.data.skip_invalid,
                                       cfg.data.max_rows)
        what = "preference pair(s)"
    else:
        examples, summary = load_examples(root, list(cfg.data.train_files), tokenizer,
                                          cfg.trainer.max_length, cfg.data.skip_invalid,
                                          cfg.data.max_rows,
                                          image_tokens=image_token_counter(vision),
                                          languages=cfg.data.languages, **_view(kind, extra))
        what = f"example(s) ({summary['target_tokens']} target tokens)"
        if summary["unreadable"]:
            what += (f"; {summary['unreadable']} SER row(s) skipped: the template cannot read "
                     "their history and replies for the outcome model")
    total = cfg.trainer.total_steps or cfg.trainer.epochs * steps_per_epoch(len(examples),
                                                                            cfg.trainer.batch_size)
    _log(f"model {model_path}; data {root}: {summary['examples']} {what}; "
         f"{summary['too_long']} dropped as longer than max_length={cfg.trainer.max_length}; "
         f"{summary['invalid']} invalid skipped; "
         + (f"left out by data.languages: {summary['other_languages']}; "
            if summary.get("other_languages") else "")
         + f"read in {time.perf_counter() - t0:.1f} s; "
         f"{total} step(s) of {cfg.trainer.batch_size}")
    if summary.get("with_images"):
        _log(f"{summary['with_images']} row(s) have images: " + (
            "trained with them (SER: in the Step 2 round; sft: in the prompt)" if vision
            else "the model is text-only, so they are trained on their words alone"))
    use_gpu = cfg.resources.gpus_per_worker > 0 or torch.cuda.is_available()
    config = {
        "kind": kind, "model_path": model_path, "data_root": str(root),
        "train_files": list(cfg.data.train_files), "skip_invalid": cfg.data.skip_invalid,
        "max_rows": cfg.data.max_rows, "max_length": cfg.trainer.max_length,
        "languages": list(cfg.data.languages),
        "batch_size": cfg.trainer.batch_size, "micro_batch_size": cfg.trainer.micro_batch_size,
        "total_steps": int(total), "lr": cfg.trainer.lr, "lr_scheduler": cfg.trainer.lr_scheduler,
        "warmup_steps": cfg.trainer.warmup_steps, "min_lr_ratio": cfg.trainer.min_lr_ratio,
        "weight_decay": cfg.trainer.weight_decay, "grad_clip": cfg.trainer.grad_clip,
        "save_freq": cfg.trainer.save_freq, "log_freq": cfg.trainer.log_freq,
        "seed": cfg.trainer.seed, "bf16": cfg.trainer.bf16,
        "gradient_checkpointing": cfg.model.gradient_checkpointing,
        "freeze_vision_tower": cfg.model.freeze_vision_tower,
        "cpus_per_worker": cfg.resources.cpus_per_worker, "use_gpu": use_gpu,
        "output_dir": str(out), "extra_files": extra,
    }
    resources = {"CPU": float(cfg.resources.cpus_per_worker)}
    if use_gpu:
        resources["GPU"] = float(cfg.resources.gpus_per_worker or 1)
    # Ray Train V2 routes worker print() through its logger; with Ray's own stdout capture that
    # doubles every line, and dill (datasets' fingerprinting) then leaks disassembly it meant to
    # capture. Propagated to the controller and workers (ray/train/v2/_internal/constants.py).
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    import ray

    started_ray = not ray.is_initialized()
    init_ray(cfg, dashboard=True)
    trainer = TorchTrainer(
        train_loop, train_loop_config=config,
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
    try:
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
    state = json.loads((final / STATE_FILE).read_text(encoding="utf-8"))
    if state["step"] < total:
        raise RuntimeError(f"the newest checkpoint is step {state['step']} < {total}")
    _log(f"done: {state['step']} step(s) in {time.perf_counter() - t0:.0f} s")
    _log(f"output directory: {out} (model: {final})")
    (final / TRAIN_TIME_FILE).write_text(json.dumps(
        {"seconds": round(time.perf_counter() - t0, 1), "steps": state["step"], "kind": kind,
         "world_size": cfg.trainer.world_size}), encoding="utf-8")
    if kind == "rm":
        _log(f"score the judge: peer-rl eval rm --model {final} --out {out / 'eval_rm.json'}")
    if kind in ("prm", "orm"):
        _log(f"score the pair: peer-rl eval rm --prm <prm>/final --orm <orm>/final --out "
             f"{out / 'eval_rm.json'}")
    if kind == "bt":
        _log(f"score the reward model: peer-rl eval pairs --model {final}")
    print(final, flush=True)
    return final


def ensure_trained_tiny_reward_model(cache_dir: str | Path, ray_address: str = "") -> str:
    """The tiny scalar reward model after `train-rm recipe=escrag_rm_tiny` (Bradley-Terry on the
    sample's preference pairs), trained once into <cache_dir>/trained/reward and reused."""
    from peer_rl.config_supervised import load_supervised_config

    run_dir = Path(cache_dir) / "trained" / "reward"
    final = run_dir / "final"
    if not (final / "config.json").exists():
        _log(f"first run: training the tiny scalar reward model once (train-rm "
             f"recipe=escrag_rm_tiny, ~2 minutes on 2 cores; cached in {run_dir})")
        over = ["recipe=escrag_rm_tiny", f"trainer.output_dir={run_dir}",
                f"model.tiny_cache_dir={cache_dir}"]
        cfg = load_supervised_config(over + ([f"ray.address={ray_address}"] if ray_address
                                             else []), "bt")
        run_supervised(cfg, "bt")
    return str(final)


def ensure_trained_tiny_escrag_policy(cache_dir: str | Path, ray_address: str = "") -> str:
    """The tiny policy after ESCRAG-R1's cold start (`sft recipe=escrag_sft_tiny` from the tiny
    PEER-SFT policy, which already writes the sample's languages): writes `<think>...</think>`
    then a reply; trained once into <cache_dir>/trained/escrag_policy and reused."""
    from peer_rl.config_supervised import load_supervised_config

    run_dir = Path(cache_dir) / "trained" / "escrag_policy"
    final = run_dir / "final"
    if not (final / "config.json").exists():
        start = ensure_trained_tiny_models(cache_dir, ray_address)["policy"]
        _log(f"first run: the tiny policy's cold-start SFT on the <think> format once (sft "
             f"recipe=escrag_sft_tiny, ~1.5 minutes on 2 cores; cached in {run_dir})")
        over = ["recipe=escrag_sft_tiny", f"model.path={start}", f"trainer.output_dir={run_dir}"]
        cfg = load_supervised_config(over + ([f"ray.address={ray_address}"] if ray_address
                                             else []), "sft")
        run_supervised(cfg, "sft")
    return str(final)


def ensure_trained_tiny_models(cache_dir: str | Path, ray_address: str = "") -> dict[str, str]:
    """The tiny judge after `peer-rl train-rm` and the tiny policy after `peer-rl sft` (their
    default recipes, on the bundled sample), trained once into <cache_dir>/trained and reused.

    A random judge answers nothing parseable and a random policy writes no Step markers, so a
    GRPO run between them shows reward 0 on every step; these have learned the formats, which
    is what the default `peer-rl train` starts from. An interrupted build resumes (Ray Train's
    own resume on the same output directory)."""
    from peer_rl.config_supervised import load_supervised_config

    out = {}
    for kind, name in (("rm", "judge"), ("sft", "policy")):
        run_dir = Path(cache_dir) / "trained" / name
        final = run_dir / "final"
        if not (final / "config.json").exists():
            _log(f"first run: training the tiny {name} once ({'train-rm' if kind == 'rm' else 'sft'}"
                 f", ~2-3 minutes on 2 cores; cached in {run_dir})")
            over = [f"trainer.output_dir={run_dir}", f"model.tiny_cache_dir={cache_dir}"]
            cfg = load_supervised_config(over + ([f"ray.address={ray_address}"] if ray_address
                                                 else []), kind)
            run_supervised(cfg, kind)
        out[name] = str(final)
    return out
