"""`peer-rl chain`: a pipeline of stages, resumable, then a comparison report."""
from __future__ import annotations


def _errors() -> dict:
    from peer_rl.config.schema import ConfigError  # deferred (--help)

    return {ConfigError: 2, FileNotFoundError: 2}


def _chain(args) -> int:
    from peer_rl.chain.run import run_chain  # deferred (--help)

    return run_chain(args.name, args.overrides, only=args.only, dry_run=args.dry_run)


def register(sub) -> None:
    p = sub.add_parser("chain", help="a pipeline of stages (fetch, sft, train-rm, eval rm, GRPO "
                       "per recipe and seed, evaluations), then a comparison report")
    p.add_argument("name", help="a chain in recipes/chains (e.g. smollm2) or a YAML path")
    p.add_argument("overrides", nargs="*", help="chain values: out=DIR seeds=[0,1] ...")
    p.add_argument("--only", nargs="*", help="run just these stages (the report then shows "
                   "what is on disk)")
    p.add_argument("--dry-run", action="store_true", help="list what would run")
    p.set_defaults(fn=_chain, errors=_errors)
