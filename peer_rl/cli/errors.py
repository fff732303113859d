"""One place where an error becomes one line on stderr and an exit code.

Each subcommand declares its map (`errors=` on its parser: a callable returning
{exception type: code or Exit}, so the types are imported only when the command runs); the
first type the error is an instance of decides. Codes: 2 bad input or settings (nothing was
started, or nothing lost), 3 a pool or endpoint that cannot go on (what finished is on disk),
143 stopped by a signal after a checkpoint.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass


class CommandError(ValueError):
    """Arguments that cannot work together (exit 2)."""


@dataclass(frozen=True)
class Exit:
    code: int
    prefix: str = "error: "
    then: str = ""          # a second line, formatted with the command's arguments


def run(fn: Callable[[argparse.Namespace], int], args: argparse.Namespace,
        errors: Callable[[], dict] | None = None) -> int:
    table = {CommandError: 2} | (errors() if errors is not None else {})
    try:
        return fn(args)
    except tuple(table) as exc:
        how = next(v for k, v in table.items() if isinstance(exc, k))
        how = how if isinstance(how, Exit) else Exit(how)
        print(f"{how.prefix}{exc}" + ("\n" + how.then.format(**vars(args)) if how.then else ""),
              file=sys.stderr)
        return how.code
