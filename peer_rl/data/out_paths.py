"""Where a command may write: never into its own input, never over files it did not make
unless told (--force), never outside its directory through a name from the command line."""
from __future__ import annotations

from pathlib import Path


class OutputError(ValueError):
    """An output that would destroy or mix data: names the path and the way on."""


def _inside(child: Path, parent: Path) -> bool:
    child, parent = child.resolve(), parent.resolve()
    return child == parent or parent in child.parents


def refuse_inside(out: str | Path, inputs, flag: str = "--out") -> None:
    """`out` may not be one of the input roots (directories) or lie inside one (the inputs
    stay as they are)."""
    for root in map(Path, inputs):
        if _inside(Path(out), root):
            raise OutputError(f"{flag} {out}: is {'' if Path(out).resolve() == root.resolve() else 'inside '}"
                              f"the input {root}; write to a directory outside it (the input "
                              "stays as it is)")


def refuse_existing(paths, force: bool, flag: str = "--out") -> None:
    """None of `paths` may exist already, unless `force`."""
    found = [str(p) for p in paths if Path(p).exists()]
    if found and not force:
        raise OutputError(f"{flag}: {len(found)} file(s) would be overwritten, e.g. {found[0]}; "
                          "choose a new directory or pass --force to replace them")


def refuse_nonempty(out: str | Path, force: bool, flag: str = "--out") -> None:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{flag} {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        first = sorted(p.name for p in out.iterdir())[:3]
        raise OutputError(f"{flag} {out}: not empty ({', '.join(first)} ...); choose a new "
                          "directory or pass --force to write over what is there")


def plain_name(name: str, what: str) -> str:
    """A file or directory name from the command line: one path component, no climbing."""
    if not name or name in (".", "..") or any(c in name for c in "/\\") or "\0" in name:
        raise OutputError(f"{what}={name!r}: expected a plain file name (no '/', '\\', '..')")
    return name
