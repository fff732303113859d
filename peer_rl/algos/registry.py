"""A name -> function table with verl's register/get pair, failing on an unknown name with the
config key and the known names; and the names a config may choose, readable without torch.

The tables fill when the modules that register into them are imported, and those need torch
(~2-4 s to import). The config is checked far more often than a step runs (`peer-rl plan`,
`peer-rl config`, every CLI start), so it reads `known_names`: the built-in names listed here
(tests/algos/test_algos.py holds them equal to what the modules register) plus whatever a
plug-in has registered since.
"""
from __future__ import annotations

from collections.abc import Callable

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                  "seq-mean-token-sum-norm")
BUILTIN_NAMES: dict[str, tuple[str, ...]] = {
    "algorithm.adv_estimator": ("grpo", "rloo", "reinforce_plus_plus_baseline"),
    "actor.policy_loss.loss_mode": ("vanilla", "gspo"),
}
_TABLES: dict[str, dict[str, Callable]] = {}


def make_registry(config_key: str) -> tuple[dict[str, Callable], Callable, Callable]:
    """(table, register(name) decorator, get(name))."""
    table: dict[str, Callable] = _TABLES.setdefault(config_key, {})

    def register(name: str):
        def deco(fn):
            table[name] = fn
            return fn
        return deco

    def get(name: str) -> Callable:
        if name not in table:
            raise KeyError(f"{config_key}={name!r}; known: {sorted(table)}")
        return table[name]

    return table, register, get


def known_names(config_key: str) -> tuple[str, ...]:
    """The built-in names of a registry, then any registered beyond them."""
    builtin = BUILTIN_NAMES[config_key]
    return builtin + tuple(n for n in _TABLES.get(config_key, {}) if n not in builtin)
