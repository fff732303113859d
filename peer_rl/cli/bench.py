"""`peer-rl bench NAME [args]`: benchmarks that print a table (peer_rl.bench)."""
from __future__ import annotations

import argparse
import importlib

# each module has main(argv) -> exit code and prints its table
BENCHES = {"rewards": "peer_rl.bench.rewards", "step": "peer_rl.bench.step",
           "sync": "peer_rl.bench.sync", "update": "peer_rl.bench.update",
           "rollout": "peer_rl.bench.rollout", "overlap": "peer_rl.bench.overlap",
           "trl": "peer_rl.bench.trl", "model": "peer_rl.bench.models"}


def _bench(args) -> int:
    return importlib.import_module(BENCHES[args.what]).main(args.rest)


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks that print a table")
    p.add_argument("what", choices=list(BENCHES))
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=_bench)
