"""A name -> function table with verl's register/get pair, failing on an unknown name with the
config key and the known names."""
from __future__ import annotations

from collections.abc import Callable


def make_registry(config_key: str) -> tuple[dict[str, Callable], Callable, Callable]:
    """(table, register(name) decorator, get(name))."""
    table: dict[str, Callable] = {}

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
