"""Micro-batches by token budget (verl's `ppo_max_token_len_per_gpu`), not by a fixed count.

A fixed count of sequences per forward either wastes memory on short replies or runs out of it
on long ones; a budget of tokens keeps the activation size of every forward about the same.
Rows are padded only to the longest row of their own micro-batch, so rows of similar length go
together (longest first). Every FSDP rank must run the same number of forwards (each one
all-gathers the layers), so the caller agrees on the largest count over ranks and asks for
exactly that many groups.
"""
from __future__ import annotations

from typing import Sequence


def _cost(group: list[int], lengths: Sequence[int], padded: bool = True) -> int:
    if not padded:
        return sum(lengths[i] for i in group)
    return len(group) * max(lengths[i] for i in group)


def by_token_budget(lengths: Sequence[int], budget: int, n_groups: int | None = None,
                    padded: bool = True) -> list[list[int]]:
    """Indices of `lengths`, longest first, cut into groups of at most `budget` tokens: padded
    tokens (rows x longest row), or with `padded=False` (rows packed end to end,
    peer_rl.compute.packing) the rows' own tokens; a row longer than the budget is a group of its own.
    With `n_groups` (>= the natural count, <= len(lengths)) the costliest groups are halved
    until there are that many."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return _cut(order, lambda g: _cost(g, lengths, padded), budget, n_groups)


def _cut(order: list[int], cost, budget: int, n_groups: int | None) -> list[list[int]]:
    """Rows in `order` filled greedily into groups whose `cost(group)` stays within `budget`
    (a row over it alone); with `n_groups` the costliest groups of more than one row are
    halved until there are that many."""
    groups: list[list[int]] = []
    for i in order:
        if groups and cost(groups[-1] + [i]) <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    if n_groups is not None:
        if not len(groups) <= n_groups <= len(order):
            raise ValueError(f"n_groups={n_groups}: expected between {len(groups)} and "
                             f"{len(order)} for {len(order)} rows")
        while len(groups) < n_groups:
            g = max((g for g in groups if len(g) > 1), key=cost)
            k = groups.index(g)
            groups[k:k + 1] = [g[:len(g) // 2], g[len(g) // 2:]]
    return groups


def by_count(n: int, size: int) -> list[list[int]]:
    """Consecutive groups of `size` rows (the fixed `ppo_micro_batch_size` route)."""
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


def unit_cost(group: list[int], lengths: Sequence[int], unit: Sequence[int],
               prefix: Sequence[int]) -> int:
    """Tokens a packed forward of `group` runs when each unit's prefix runs once."""
    seen: set[int] = set()
    cost = 0
    for i in group:
        cost += lengths[i] - (prefix[i] if unit[i] in seen else 0)
        seen.add(unit[i])
    return cost


def by_units(lengths: Sequence[int], unit: Sequence[int], prefix: Sequence[int], budget: int,
             n_groups: int | None = None) -> list[list[int]]:
    """by_token_budget for packed rows with shared prefixes (peer_rl.compute.shared_prefix):
    a unit's rows (unit[i]: a group's rows, sharing prefix[i] tokens) stay together, costliest
    unit first, and a unit's prefix is counted once in a micro-batch. With `n_groups` the
    costliest groups are halved until there are that many."""
    members: dict[int, list[int]] = {}
    for i, u in enumerate(unit):
        members.setdefault(u, []).append(i)
    order = [i for u in sorted(members, key=lambda u: (-unit_cost(members[u], lengths, unit,
                                                                   prefix), u))
             for i in members[u]]
    return _cut(order, lambda g: unit_cost(g, lengths, unit, prefix), budget, n_groups)
