"""`peer-rl train` (GRPO), `peer-rl train-rm` and `peer-rl sft` (the supervised stages)."""
from __future__ import annotations

from peer_rl.cli.errors import Exit
from peer_rl.trainer.preemption import EXIT_CODE, RunStopped


def _train_errors() -> dict:
    from peer_rl.config.schema import ConfigError  # deferred (--help)
    from peer_rl.data.loading import InvalidDataError  # deferred: pulls in datasets
    from peer_rl.data.prompt_loader import PromptPoolError  # deferred (--help)
    # deferred: pulls in numpy, torch
    from peer_rl.trainer.dynamic_sampling import DynamicSamplingLimit
    from peer_rl.trainer.worker_group import PoolFailed  # deferred: pulls in numpy, ray
    from peer_rl.trainer.cluster_watch import ClusterLost  # deferred (--help)

    return {ConfigError: 2, FileNotFoundError: 2, InvalidDataError: 2, PromptPoolError: 2,
            DynamicSamplingLimit: 2,        # the data gave too few groups with a signal
            PoolFailed: 3,                  # a policy rank died, or a worker past its restarts
            ClusterLost: 3,                 # the Ray cluster went away (its GCS)
            RunStopped: Exit(EXIT_CODE, prefix="[peer-rl] ")}   # the step finished and was saved


def _supervised_errors() -> dict:
    from peer_rl.config.schema import ConfigError  # deferred (--help)
    from peer_rl.data.loading import InvalidDataError  # deferred: pulls in datasets
    from peer_rl.trainer.supervised_run import TemplateMismatch  # deferred (--help)

    return {ConfigError: 2, FileNotFoundError: 2, InvalidDataError: 2, TemplateMismatch: 2}


def _train(args) -> int:
    from peer_rl.trainer.run import run  # deferred (--help)

    run(args.overrides)
    return 0


def _supervised(args) -> int:
    from peer_rl.supervised.config import load_supervised_config  # deferred (--help)
    from peer_rl.trainer.supervised_run import run_supervised  # deferred (--help)

    cfg = load_supervised_config(args.overrides, args.kind)
    # train-rm runs UnifiReward (rm) or scalar (bt) recipes; the last line is the model's path
    # (for scripts), which the default run's first-time training does not print
    print(run_supervised(cfg, cfg.kind), flush=True)
    return 0


def register(sub) -> None:
    p = sub.add_parser("train", help="GRPO training (default: the tiny recipe on the sample)",
                       description="peer-rl train [recipe=NAME] [key=value ...], e.g. "
                       "peer-rl train recipe=peer_rur rollout.num_workers=2 trainer.total_steps=5")
    p.add_argument("overrides", nargs="*", help="recipe=NAME and dotted key=value overrides")
    # the run has saved everything and stopped Ray: skip the interpreter's teardown (cli.leave)
    p.set_defaults(fn=_train, errors=_train_errors, leave_early=True)
    for name, kind, what in (("train-rm", "rm", "UnifiReward SFT on SER chats (default recipe "
                              "unifireward_tiny)"),
                             ("sft", "sft", "policy SFT on sft/ rows (default recipe sft_tiny)")):
        p = sub.add_parser(name, help=what, description=f"peer-rl {name} [recipe=NAME] "
                           "[key=value ...]; prints the output directory at the end")
        p.add_argument("overrides", nargs="*", help="recipe=NAME and dotted key=value overrides")
        p.set_defaults(fn=_supervised, kind=kind, errors=_supervised_errors)
