"""`peer-rl bench NAME [args]`: benchmarks that print a table (peer_rl.bench)."""
from __future__ import annotations

import argparse
import importlib

from peer_rl.errors import ConfigError, MissingDependency

# each module has main(argv) -> exit code and prints its table
BENCHES = {"rewards": "peer_rl.bench.rewards", "step": "peer_rl.bench.step",
           "sync": "peer_rl.bench.sync", "update": "peer_rl.bench.update",
           "rollout": "peer_rl.bench.rollout", "overlap": "peer_rl.bench.overlap",
           "trl": "peer_rl.bench.trl", "model": "peer_rl.bench.models",
           "memory": "peer_rl.bench.memory", "load": "peer_rl.bench.load"}


def _bench(args) -> int:
    module = importlib.import_module(BENCHES[args.what])
    if args.rest[:1] in (["-h"], ["--help"]) and not getattr(module, "PARSES_ITS_ARGS", False):
        print((module.main.__doc__ or module.__doc__).strip())   # benchmarks without a parser
        return 0
    return module.main(args.rest)


def _errors() -> dict:
    return {ConfigError: 2, MissingDependency: 2}


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks that print a table")
    p.add_argument("what", choices=list(BENCHES))
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=_bench, errors=_errors)
