"""`peer-rl bench NAME [args]`: benchmarks that print a table (peer_rl.bench)."""
from __future__ import annotations

import argparse
import importlib

from peer_rl.errors import ConfigError, MissingDependency

# each module has main(argv) -> exit code and prints its table; what it measures, for --help
BENCHES = {"rewards": "peer_rl.bench.rewards", "step": "peer_rl.bench.step",
           "sync": "peer_rl.bench.sync", "update": "peer_rl.bench.update",
           "rollout": "peer_rl.bench.rollout", "overlap": "peer_rl.bench.overlap",
           "trl": "peer_rl.bench.trl", "model": "peer_rl.bench.models",
           "memory": "peer_rl.bench.memory", "load": "peer_rl.bench.load"}
SUMMARIES = {
    "rewards": "the reward math's throughput (RUR, advantages)",
    "step": "the per-stage time split of tiny GRPO steps, from a real run",
    "sync": "seconds per policy -> engine weight sync, blob path versus collective",
    "update": "peak memory and tokens/s of one policy update step, per setting",
    "rollout": "the rollout engine (vLLM) versus transformers' generate",
    "overlap": "steps/s with trainer.async_training.staleness 0 versus 1",
    "trl": "a PEER-RUR step of peer-rl against one of TRL's GRPOTrainer at equal work",
    "model": "build (once) and print the random benchmark policies' directories",
    "memory": "plan's per-worker memory held against finished runs' measured peaks",
    "load": "the host memory each policy rank holds at most while it loads",
}


def _bench(args) -> int:
    module = importlib.import_module(BENCHES[args.what])
    if args.rest[:1] in (["-h"], ["--help"]) and not getattr(module, "PARSES_ITS_ARGS", False):
        print((module.main.__doc__ or module.__doc__).strip())   # benchmarks without a parser
        return 0
    return module.main(args.rest)


def _errors() -> dict:
    return {ConfigError: 2, MissingDependency: 2}


def register(sub) -> None:
    p = sub.add_parser(
        "bench", help="benchmarks that print a table",
        description="peer-rl bench NAME [args]: a benchmark that prints a table; "
                    "`peer-rl bench NAME --help` gives its arguments.",
        epilog="benchmarks:\n" + "\n".join(f"  {name:9s} {SUMMARIES[name]}" for name in BENCHES),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=list(BENCHES))
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=_bench, errors=_errors)
