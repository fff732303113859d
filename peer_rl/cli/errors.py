"""One place where an error becomes one line on stderr and an exit code.

Each subcommand declares its map (`errors=` on its parser: a callable returning
{exception type: code or Exit}, so the types are imported only when the command runs); the
first type the error is an instance of decides. Codes: 2 bad input or settings (nothing was
started, or nothing lost), 3 a pool or endpoint that cannot go on (what finished is on disk),
4 the machine failed a read or write (disk full, I/O error; files are written whole, so what
was written before stands), 143 stopped by a signal after a checkpoint.

Errors no command maps still end in one line: a path that is missing, not a file or not
readable, an input that is not UTF-8 or nested too deep to read (exit 2); any other OSError
(exit 4).
"""
from __future__ import annotations

import argparse
import errno
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


# a read or write the machine refused, whatever the command maps OSError to: exit 4
MACHINE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}
# after every command's own map: the first matching type decides, so these only catch what a
# command did not name
FALLBACK: dict = {
    FileNotFoundError: 2, IsADirectoryError: 2, NotADirectoryError: 2, PermissionError: 2,
    UnicodeDecodeError: Exit(2, prefix="error: an input is not UTF-8: "),
    RecursionError: Exit(2, prefix="error: an input is nested too deep to read: "),
    OSError: 4,
}


def run(fn: Callable[[argparse.Namespace], int], args: argparse.Namespace,
        errors: Callable[[], dict] | None = None) -> int:
    table = {CommandError: 2} | (errors() if errors is not None else {})
    for kind, how in FALLBACK.items():         # after the command's own, which decide first
        table.setdefault(kind, how)
    try:
        return fn(args)
    except tuple(table) as exc:
        how = (Exit(4) if isinstance(exc, OSError) and exc.errno in MACHINE_ERRNOS
               else next(v for k, v in table.items() if isinstance(exc, k)))
        how = how if isinstance(how, Exit) else Exit(how)
        print(f"{how.prefix}{exc}" + ("\n" + how.then.format(**vars(args)) if how.then else ""),
              file=sys.stderr)
        return how.code
