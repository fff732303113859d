"""On disk before the next step reads it: fsync of files and of the directories that name them."""
from __future__ import annotations

import os
from pathlib import Path


def fsync_tree(directory: str | Path) -> dict[str, int]:
    """fsync every file under `directory` and the directories themselves (a checkpoint must be
    on disk before the file that marks it complete); returns {relative path: size}."""
    root = Path(directory)
    seen: dict[str, int] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
            seen[str(path.relative_to(root))] = path.stat().st_size
    for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        fsync_dir(d)
    return seen


def fsync_dir(directory: str | Path) -> None:
    """A directory's entries (a rename into it) on disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
