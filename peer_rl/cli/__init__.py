"""`peer-rl`: one module per subcommand, each registering its parser and its error map
(`register(sub)`); peer_rl.cli.errors turns an error into one line and an exit code.

Building the parser imports every subcommand module, so in this room an import that reaches a
third-party library is made inside the command that needs it (marked `# deferred (--help)`):
`peer-rl --help` and a mistyped command answer without loading numpy, torch or Ray."""
from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys

from peer_rl.cli.errors import run

# the subcommand modules, in the order `peer-rl --help` lists them
COMMANDS = ("data", "train", "plot", "judge_template", "models", "eval", "index", "chain",
            "plan", "chat", "bench")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="peer-rl", description="Ray-distributed GRPO for "
                                "emotional-support language models (PEER, ESCRAG-R1)")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in COMMANDS:
        importlib.import_module(f"peer_rl.cli.{name}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """`argv` None: the program itself (sys.argv), which a command may then leave early."""
    p = parser()
    args, rest = p.parse_known_args(argv)
    # key=value overrides may also follow an option (`eval ladder NAME --out DIR paths.x=...`)
    if rest and isinstance(getattr(args, "overrides", None), list) \
            and all("=" in r and not r.startswith("-") for r in rest):
        args.overrides += rest
    elif rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    code = run(args.fn, args, getattr(args, "errors", None))
    if argv is None and getattr(args, "leave_early", False):
        leave(code)
    return code


def leave(code: int) -> None:
    """End the process once its work is saved: the exit handlers run (Ray's, logging's, the
    finalizers), stdout and stderr are flushed, and the interpreter's own teardown is skipped:
    after a training run, freeing torch's, vLLM's and Ray's native state took ~2.7 s
    (measured 2026-12-03) and has nothing left to write. Non-daemon threads are not joined (the
    interpreter joins them before the exit handlers): a command that leaves early waits on its
    own threads first, as `train` does on its prompt-length and figure threads."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):          # closed or gone: nothing left to write there
            pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
