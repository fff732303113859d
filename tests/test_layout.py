"""The house's rooms and who may import what (docs/architecture.md, "Rooms").

Every import in peer_rl/ and workers/ (inside functions too) is read off the source, and each
must point to its own room or to a room listed before it in ROOMS: data flows one way, from the
command line through the drivers to the workers and the pure functions below them, so there is
no cycle between rooms and only the drivers reach into workers."""
import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# lowest first: a room imports only the rooms before it (and itself)
ROOMS = (
    "errors", "protocol", "log",                # contracts every room shares (log: console lines)
    "recipes",                                  # the recipe files
    "algos", "prompts", "compute", "files",     # pure functions: rewards, readers, tensors, files
    "models", "data", "retrieval",              # local models, rows, the exemplar index
    "config", "tracking", "methods",            # the typed config, metric sinks, reward methods
    "supervised", "planning",                   # supervised pieces, the memory/placement planner
    "workers",                                  # the Ray workers
    "integrations", "evaluation", "trainer",    # drivers: they start or host workers
    "datajobs", "bench", "chain", "cli",
)
CONTRACTS = {"__init__.py", "errors.py", "protocol.py", "log.py"}


def _room(path: Path) -> str:
    rel = path.relative_to(ROOT)
    if rel.parts[0] in ("workers", "recipes"):
        return rel.parts[0]
    return "peer_rl" if rel.parts[1] == "__init__.py" else rel.parts[1].removesuffix(".py")


def _target(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "peer_rl" or len(parts) == 1:
        return None
    return parts[1]


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = ([f"peer_rl.{a.name}" for a in node.names] if node.module == "peer_rl"
                     else [node.module])
            for name in names:
                yield node.lineno, name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def _sources():
    return sorted([*(ROOT / "peer_rl").rglob("*.py"), *(ROOT / "workers").rglob("*.py")])


def test_each_room_imports_only_the_rooms_below_it():
    rank = {room: i for i, room in enumerate(ROOMS)}
    wrong = []
    for path in _sources():
        room = _room(path)
        if room == "peer_rl":
            continue
        assert room in rank, f"{path.relative_to(ROOT)}: room {room!r} is not in ROOMS"
        for line, module in _imports(path):
            target = _target(module)
            if target is None or target == room:
                continue
            if target not in rank or rank[target] > rank[room]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module} "
                             f"({room} may import only {ROOMS[:rank[room]]})")
    assert wrong == [], "\n".join(wrong)


def test_nothing_imports_the_folders_by_their_top_level_names():
    wrong = []
    for path in [*_sources(), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]:
        for line, module in _imports(path):
            if module.split(".")[0] in ("workers", "recipes"):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert wrong == [], "\n".join(wrong)


def test_only_the_shared_contracts_sit_at_the_top_of_the_package():
    loose = sorted(p.name for p in (ROOT / "peer_rl").glob("*.py") if p.name not in CONTRACTS)
    assert loose == []


def test_the_distribution_lists_every_package_and_maps_the_folders_in():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "peer_rl").rglob("__init__.py") if "bundled" not in p.parts}
    assert set(tool["packages"]) == found | {"peer_rl.workers", "peer_rl.recipes"}
    assert tool["package-dir"] == {"": ".", "peer_rl.workers": "workers",
                                   "peer_rl.recipes": "recipes"}


def _python(code: str, cwd: Path, pythonpath: str | None = None) -> list[str]:
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.e2e   # a child interpreter
def test_outside_the_checkout_only_peer_rl_is_an_import_name(tmp_path):
    """As installed (no PYTHONPATH), from another directory: `workers` and `recipes` are not
    import names; `peer_rl.workers` and `peer_rl.recipes` are the folders beside the package."""
    found = _python("import importlib.util\n"
                    "print(*(importlib.util.find_spec(n) is None for n in ('workers', 'recipes')))\n"
                    "import peer_rl, peer_rl.workers, peer_rl.recipes\n"
                    "print(peer_rl.__file__, peer_rl.workers.__file__, peer_rl.recipes.__file__)",
                    tmp_path)
    assert found[:2] == ["True", "True"]
    package, workers, recipes = (Path(p).resolve().parent for p in found[2:])
    assert (workers.name, recipes.name) == ("workers", "recipes")
    assert package.parent == workers.parent == recipes.parent


@pytest.mark.e2e   # a child interpreter
def test_a_second_checkout_runs_its_own_workers(tmp_path):
    """A checkout put on PYTHONPATH (a `ray job submit --working-dir` upload, a worktree) maps
    its own folders, not those of the checkout installed in editable mode."""
    other = tmp_path / "checkout"
    for name in ("peer_rl", "workers", "recipes"):
        (other / name).mkdir(parents=True)
    for name in ("__init__.py", "log.py"):    # the package's own start: its import names, its log
        (other / "peer_rl" / name).write_bytes((ROOT / "peer_rl" / name).read_bytes())
    (other / "workers" / "__init__.py").write_text("")
    (other / "recipes" / "__init__.py").write_text("")
    (other / "pyproject.toml").write_text("")
    found = _python("import peer_rl.workers, peer_rl.recipes\n"
                    "print(peer_rl.workers.__file__, peer_rl.recipes.__file__)", tmp_path, str(other))
    assert [Path(p).resolve().parent for p in found] == [other / "workers", other / "recipes"]


@pytest.mark.parametrize("room", ROOMS[4:])
def test_every_room_named_here_exists(room):
    assert (ROOT / "peer_rl" / room).is_dir() or (ROOT / room).is_dir()
