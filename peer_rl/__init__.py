"""peer-rl: Ray-distributed GRPO for emotional-support LLMs (PEER, PEER-RUR, ESCRAG-R1).

One import name. The Ray worker modules and the recipe files keep the repository's top-level
folders `workers/` and `recipes/` and are reached as `peer_rl.workers` and `peer_rl.recipes`:
a built wheel places them inside the package (pyproject's `package-dir`), and a checkout used in
place (an editable install, `PYTHONPATH=<checkout>`, a `ray job submit --working-dir` upload)
maps them here, so a checkout always runs its own workers beside its own package.

Importing the package also sets up the console handler of peer-rl's progress lines
(peer_rl/log.py).
"""
from __future__ import annotations

import sys
from importlib.machinery import PathFinder
from pathlib import Path

from peer_rl.log import configure_console

_HERE = Path(__file__).resolve().parent
_CHECKOUT = _HERE.parent
FOLDERS = ("workers", "recipes")


class _CheckoutFolders:
    """Finds `peer_rl.workers` / `peer_rl.recipes` in the checkout's top-level folders."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in FOLDERS:
            return None
        return PathFinder.find_spec(fullname, [str(_CHECKOUT)])


def _in_checkout() -> bool:
    """A source tree (not a wheel, where the folders sit inside the package)."""
    return (_CHECKOUT / "pyproject.toml").is_file() and not (_HERE / "workers").exists() \
        and all((_CHECKOUT / name / "__init__.py").is_file() for name in FOLDERS)


if _in_checkout() and not any(isinstance(f, type) and f.__name__ == "_CheckoutFolders"
                              and f.__module__ == __name__ for f in sys.meta_path):
    # first: an editable install's own finder would map the folders of the installed checkout
    sys.meta_path.insert(0, _CheckoutFolders)

configure_console()   # every process that imports peer_rl (Ray workers too) prints its lines
