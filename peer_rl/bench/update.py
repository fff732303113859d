"""`peer-rl bench update`: peak memory and tokens/s of one policy update step, per setting.

One policy rank (peer_rl.workers.policy, gloo on CPU / NCCL on GPU) on a random Qwen2.5-0.5B-shaped
model (peer_rl.bench.models "500M", its 151,936-token output layer included) takes one update
step on `--tokens` tokens (rows of `--seq` tokens, half prompt and half reply). Each setting runs
in a fresh process, so its peak resident memory is its own; a watchdog stops a setting that
passes `--limit-gb` (reported as such: the setting would not fit the machine).

Settings (the memory-lean update of actor.*):
  plain       logits_chunk_size=0, ppo_max_token_len_per_gpu=0: full float32 logits over every
              position of the micro-batch, as peer-rl did before
  chunked     logits_chunk_size=1024: the output layer 1024 positions at a time, checkpointed
  chunked+ckpt  and actor.gradient_checkpointing (decoder layers recomputed in backward)
The old and reference log-probs are given in the batch, so the figure is the training
forward + backward + optimizer step; peak is the process's, model and AdamW state included.
`--dtypes float32,bfloat16` runs each setting at each compute dtype (actor.dtype; default auto,
peer_rl.compute.precision). `--group G` makes the rows GRPO groups: G rows a prompt of `--prompt`
tokens (default half the row), each with its own reply; `--shared-prefix off,on` runs each
setting with actor.shared_prefix false and true (peer_rl.compute.shared_prefix), and the table
gives the tokens the forward ran.
"""
from __future__ import annotations

import socket

import numpy as np

from peer_rl.bench.models import SHAPES
from peer_rl.compute.precision import check_dtype
from peer_rl.config.schema import ActorConfig
from peer_rl.config.worker_settings import PolicySettings
from peer_rl.protocol import UpdateBatch

PARSES_ITS_ARGS = True          # peer-rl bench NAME --help goes to its argparse

import argparse
import json
import os
import subprocess
import sys
import threading
import time

SETTINGS = {
    "plain": dict(logits_chunk_size=0, ppo_max_token_len_per_gpu=0),
    "chunked": dict(logits_chunk_size=1024),
    "chunked+ckpt": dict(logits_chunk_size=1024, gradient_checkpointing=True),
}


def _rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def _watch(limit_gb: float, peak: list) -> None:
    while True:
        rss = _rss_gb()
        peak[0] = max(peak[0], rss)
        if rss > limit_gb:
            print(json.dumps({"killed_at_gb": round(rss, 2)}), flush=True)
            os._exit(3)
        time.sleep(0.02)


def _child(setting: str, model: str, tokens: int, seq: int, limit_gb: float,
           dtype: str = "auto", shared: str = "off", group: int = 1, prompt: int = 0) -> None:
    import torch  # deferred: torch (~2 s); the CLI starts without it

    from peer_rl.bench.models import random_policy  # deferred: tests patch random_policy
    from peer_rl.workers.policy import PolicyWorker  # deferred: pulls in safetensors, torch

    peak = [0.0]
    threading.Thread(target=_watch, args=(limit_gb, peak), daemon=True).start()
    torch.manual_seed(0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rows = max(1, tokens // seq)
    # one forward over the whole batch unless the setting says otherwise
    hp = {"ppo_mini_batch_size": rows, "ppo_micro_batch_size": rows,
          "ppo_max_token_len_per_gpu": rows * seq, "dtype": dtype,
          "shared_prefix": "true" if shared == "on" else "false"} | SETTINGS[setting]
    w = PolicyWorker(0, 1, "127.0.0.1", port, random_policy(model), PolicySettings(**hp))
    rng = np.random.default_rng(0)
    vocab = w.model.get_output_embeddings().weight.shape[0]
    ids = rng.integers(0, vocab, (rows, seq))
    prompt = prompt or seq // 2
    for first in range(0, rows, group):      # a group's rows: one prompt, their own replies
        ids[first:first + group, :prompt] = ids[first, :prompt]
    response = np.zeros((rows, seq), np.int64)
    response[:, prompt:] = 1
    batch = UpdateBatch(ids, np.ones((rows, seq), np.int64), response,
                        rng.standard_normal(rows).astype(np.float32),
                        old_log_probs=np.full((rows, seq), -11.0, np.float32),
                        ref_log_prob=np.full((rows, seq), -11.0, np.float32))
    before = _rss_gb()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    w.update(batch)
    sec = time.perf_counter() - t0
    gpu = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None
    print(json.dumps({"seconds": sec, "tokens": rows * seq, "peak_gb": peak[0], "dtype": w.dtype,
                      "before_gb": before, "gpu_peak_gb": gpu,
                      "forward_tokens": w.forward_tokens}), flush=True)
    w.shutdown()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="peer-rl bench update")
    ap.add_argument("--model", default="500M", help="a shape of peer_rl.bench.models")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=1024, help="tokens per row")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--limit-gb", type=float, default=20.0,
                    help="stop a setting whose resident memory passes this")
    ap.add_argument("--dtypes", default="auto",
                    help="comma-separated compute dtypes (auto, float32, bfloat16): each "
                         "setting runs at each")
    ap.add_argument("--group", type=int, default=1,
                    help="rows per prompt (a GRPO group; 1 = every row its own prompt)")
    ap.add_argument("--prompt", type=int, default=0,
                    help="prompt tokens of a row (default: half of --seq)")
    ap.add_argument("--shared-prefix", default="off",
                    help="off, on or off,on: actor.shared_prefix false / true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    shared = [x.strip() for x in args.shared_prefix.split(",")]
    if not shared or set(shared) - {"off", "on"}:
        ap.error(f"--shared-prefix {args.shared_prefix!r}: expected off, on or off,on")
    if args.group < 1 or not 0 <= args.prompt < args.seq:
        ap.error(f"--group {args.group} --prompt {args.prompt}: expected a group of at least 1 "
                 f"row and a prompt shorter than --seq {args.seq}")

    try:
        dtypes = [check_dtype(d.strip(), "--dtypes") for d in args.dtypes.split(",")]
    except ValueError as exc:
        ap.error(str(exc))
    if args.model not in SHAPES:
        ap.error(f"--model {args.model!r}: expected one of {', '.join(SHAPES)}")
    if args.child:
        _child(args.child, args.model, args.tokens, args.seq, args.limit_gb, dtypes[0],
               shared[0], args.group, args.prompt)
        return 0
    from peer_rl.bench.models import random_policy  # deferred: tests patch random_policy

    random_policy(args.model)                 # built once, before any timing
    # each setting's process allocates as a policy rank's does (actor.malloc_mmap_threshold_mib)
    from peer_rl.trainer.resource_pools import malloc_env  # deferred: pulls in ray, torch

    mib = ActorConfig.malloc_mmap_threshold_mib
    env = os.environ | malloc_env(mib)
    results = {}
    for setting in args.settings.split(","):
        for dtype in dtypes:
            for share in shared:
                print(f"[bench update] {setting} {dtype} shared prefix {share} ...", flush=True)
                proc = subprocess.run(
                    [sys.executable, "-m", "peer_rl.cli", "bench", "update", "--child", setting,
                     "--model", args.model, "--tokens", str(args.tokens), "--seq",
                     str(args.seq), "--limit-gb", str(args.limit_gb), "--dtypes", dtype,
                     "--shared-prefix", share, "--group", str(args.group), "--prompt",
                     str(args.prompt)], capture_output=True, text=True, env=env)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                results[setting, dtype, share] = json.loads(lines[-1]) if lines else {
                    "error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    groups = (f", groups of {args.group} rows sharing a {args.prompt or args.seq // 2}-token "
              f"prompt" if args.group > 1 else "")
    print(f"\none update step, random {args.model} policy, {args.tokens} tokens in rows of "
          f"{args.seq}{groups}, one rank on this machine ({os.cpu_count()} CPUs; glibc mmap "
          f"threshold {mib:g} MiB, as actor.malloc_mmap_threshold_mib)")
    print(f"{'setting':14s} {'dtype':9s} {'shared':6s} {'seconds':>8s} {'tokens/s':>9s} "
          f"{'forwarded':>9s} {'peak GB':>8s} {'above start GB':>15s} {'GPU peak GB':>12s}")
    for (setting, asked, share), r in results.items():
        if "seconds" in r:
            gpu = f"{r['gpu_peak_gb']:.2f}" if r["gpu_peak_gb"] is not None else "-"
            print(f"{setting:14s} {r['dtype']:9s} {share:6s} {r['seconds']:8.1f} "
                  f"{r['tokens'] / r['seconds']:9.1f} {r['forward_tokens']:9d} "
                  f"{r['peak_gb']:8.2f} {r['peak_gb'] - r['before_gb']:15.2f} {gpu:>12s}")
        elif "killed_at_gb" in r:
            print(f"{setting:14s} {asked:9s} {share:6s} stopped: resident memory passed "
                  f"{args.limit_gb:g} GB ({r['killed_at_gb']} GB)")
        else:
            print(f"{setting:14s} {asked:9s} {share:6s} failed: {r['error']}")
    return 0
