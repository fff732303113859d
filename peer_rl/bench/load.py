"""`peer-rl bench load`: the host memory each policy rank holds at most while it loads.

`--ranks` policy ranks (peer_rl.workers.policy, gloo on the CPU) of a random policy (peer_rl.bench.models,
~100M by default) start as separate processes, as `peer-rl train` starts them (glibc's mmap
threshold at actor.malloc_mmap_threshold_mib's default), and build the policy and its reference
(full weights; `--lora-rank R`: adapters, no reference copy), nothing else. Each rank reports its
peak resident memory (ru_maxrss) before the worker (Python, torch and transformers imported, no
model) and once the worker is built: the figure of the workers' start-up line "GiB resident at
most while loading". On the CPU the shards stay in host memory, so a rank holds at least its
shards of both models; what loading adds beyond them is the checkpoint each rank reads.
"""
from __future__ import annotations

from peer_rl.bench.models import SHAPES
from peer_rl.config.schema import ActorConfig
from peer_rl.config.worker_settings import LoRASettings
from peer_rl.tracking.metrics import peak_rss_bytes

PARSES_ITS_ARGS = True          # peer-rl bench NAME --help goes to its argparse

import argparse
import json
import os
import socket
import subprocess
import sys

GiB = 2**30


def _child(rank: int, world_size: int, port: int, path: str, lora_rank: int) -> None:
    """One rank: its peaks before and after the worker, as one JSON line."""
    import torch  # deferred: torch (~2 s); the CLI starts without it
    # deferred: transformers
    from transformers import AutoModelForCausalLM  # noqa: F401  (counted in "before")

    from peer_rl.workers.policy import PolicyWorker  # deferred: pulls in safetensors, torch

    torch.set_num_threads(1)
    before = peak_rss_bytes()
    w = PolicyWorker(rank, world_size, "127.0.0.1", port, path, seed=0,
                     lora_settings=LoRASettings(rank=lora_rank) if lora_rank else None)
    peak = peak_rss_bytes()
    w.shutdown()
    print(json.dumps({"rank": rank, "before_gib": before / GiB, "peak_gib": peak / GiB}),
          flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(args, env: dict) -> list[dict]:
    """Start every rank at once (the group forms only when all have joined) and read each
    one's JSON line; a rank that fails is named with its last line of output."""
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "peer_rl.cli", "bench", "load",
                               "--child", str(r), "--ranks", str(args.ranks), "--port", str(port),
                               "--model", args.model, "--lora-rank", str(args.lora_rank)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(args.ranks)]
    results = []
    for r, proc in enumerate(procs):
        out, err = proc.communicate()
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if proc.returncode or not lines:
            tail = (err.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"bench load: rank {r} exited with {proc.returncode}: {tail}")
        results.append(json.loads(lines[-1]))
    return results


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="peer-rl bench load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="100M", help="a shape of peer_rl.bench.models")
    ap.add_argument("--ranks", type=int, default=2, help="policy ranks (actor.world_size)")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="LoRA adapters of this rank (0: full weights and a reference copy)")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.model not in SHAPES:
        ap.error(f"--model {args.model!r}: expected one of {', '.join(SHAPES)}")
    if args.ranks < 1:
        ap.error(f"--ranks {args.ranks}: expected 1 or more")
    # deferred: tests patch random_policy
    from peer_rl.bench.models import num_params, random_policy

    path = random_policy(args.model)          # built once, before any rank starts
    if args.child is not None:
        _child(args.child, args.ranks, args.port, path, args.lora_rank)
        return 0
    from peer_rl.trainer.resource_pools import malloc_env  # deferred: pulls in ray, torch

    mib = ActorConfig.malloc_mmap_threshold_mib
    env = os.environ | {"OMP_NUM_THREADS": "1"} | malloc_env(mib)
    ranks = _run_ranks(args, env)
    full = num_params(path) * 4 / GiB
    what = f"LoRA r={args.lora_rank}" if args.lora_rank else "full weights + reference"
    print(f"random {args.model} policy ({full:.2f} GiB in float32), {what}, {args.ranks} "
          f"rank(s) on this machine ({os.cpu_count()} CPUs; glibc mmap threshold {mib:g} MiB)")
    print(f"{'rank':>4s} {'before GiB':>11s} {'peak GiB':>9s} {'loading added GiB':>18s}")
    for r in ranks:
        print(f"{r['rank']:4d} {r['before_gib']:11.2f} {r['peak_gib']:9.2f} "
              f"{r['peak_gib'] - r['before_gib']:18.2f}")
    print(f"sum of the ranks' peaks: {sum(r['peak_gib'] for r in ranks):.2f} GiB")
    return 0
