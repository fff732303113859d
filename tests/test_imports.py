"""Every import of a project module, anywhere in the package (inside functions too), names a
module or attribute that exists: a moved or renamed module cannot leave a lazy import behind
that only the code path running it would find."""
import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(p for d in ("peer_rl", "workers") for p in (ROOT / d).rglob("*.py"))


def _targets(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level \
                and node.module.split(".")[0] == "peer_rl":
            for alias in node.names:
                yield node.lineno, node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "peer_rl":
                    yield node.lineno, alias.name, None


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_project_import_resolves(path):
    missing = []
    for line, module, name in _targets(path):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            missing.append(f"{line}: {module} ({exc})")
            continue
        if name and name != "*" and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{line}: from {module} import {name}")
    assert missing == [], missing
