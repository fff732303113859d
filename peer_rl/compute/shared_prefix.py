"""Shared-prefix packing: the rows of a micro-batch that begin alike run their common start once.

Why: a GRPO group is G replies to one prompt, and PEER's prompts are whole dialogue histories,
often longer than the replies. Packed row by row (peer_rl.compute.packing), every row carries its
own copy of the prompt through every layer, forward and backward: G x (P + R) tokens where
P + G x R would do. Here rows are gathered into trees: a tree's first row runs whole (its
*trunk*); each further row runs only its own tokens (a *branch*), whose positions continue the
shared prefix's, and which attend to that prefix and to themselves (packing.varlen_sdpa reads
the tree from the positions alone: a position that drops below the previous one + 1 starts a
branch that sees the first `position` tokens of its tree's trunk).

Which rows share what is chosen exactly for this two-level form: the rows, sorted by the tokens
they may share, are cut into consecutive runs so that the tokens saved, sum over runs of
(rows - 1) x (their common prefix), is largest (every GRPO group's whole prompt when groups
differ early; the system prompt shared by all when that saves more). A row may share at most
`share_len` tokens (its prompt): its own tokens, which carry the loss, always run in its own
branch. Log-probs come from `packing.predictions`: each token is scored from the hidden state of
the token before it, wherever that one ran.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import torch

from peer_rl.compute.packing import Layout, flat_source
from peer_rl.compute.packing import layout as plain_layout


@dataclass(frozen=True)
class Tree:
    rows: tuple[int, ...]     # rows of the batch, the first is the trunk
    prefix: int               # tokens every row of the tree shares (0 for one row)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def trees(keys: Sequence[Sequence[int]]) -> list[Tree]:
    """Rows (their shareable tokens `keys[i]`) cut into trees saving the most tokens. Sorted, a
    run's common prefix is the least common prefix of its neighbours, so a dynamic programme
    over cut points finds the best runs in O(rows^2)."""
    order = sorted(range(len(keys)), key=lambda i: (list(keys[i]), i))
    n = len(order)
    adj = [_common(keys[order[k]], keys[order[k + 1]]) for k in range(n - 1)]
    best = [0] * (n + 1)          # best[k]: tokens saved by the best cut of order[:k]
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        best[end], cut[end] = best[end - 1], end - 1        # order[end-1] alone
        low = None
        for start in range(end - 2, -1, -1):                # run order[start:end]
            low = adj[start] if low is None else min(low, adj[start])
            saved = best[start] + (end - start - 1) * low
            if saved > best[end]:
                best[end], cut[end] = saved, start
    out, end = [], n
    while end > 0:
        start = cut[end]
        rows = tuple(order[start:end])
        prefix = min(adj[start:end - 1]) if len(rows) > 1 else 0
        out.append(Tree(rows, prefix))
        end = start
    return out[::-1]


def classed_trees(keys: Sequence[Sequence[int]],
                  classes: Sequence[Hashable] | None = None) -> list[Tree]:
    """`trees` within each class (rows of one class only share with one another), classes in
    order of first appearance. Images: rows whose images differ hold the same placeholder
    tokens for different pictures, so equal tokens are not an equal prefix."""
    if classes is None:
        return trees(keys)
    members: dict[Hashable, list[int]] = {}
    for i, c in enumerate(classes):
        members.setdefault(c, []).append(i)
    out = []
    for rows in members.values():
        out += [Tree(tuple(rows[k] for k in t.rows), t.prefix)
                for t in trees([keys[i] for i in rows])]
    return out


def layout(ids: torch.Tensor, attention_mask: torch.Tensor, share_len: Sequence[int],
           classes: Sequence[Hashable] | None = None) -> tuple[Layout, list[Tree]]:
    """The packed layout of a right-padded batch with shared prefixes: each tree's trunk whole,
    then each other row from its tree's prefix on. `share_len[i]`: the most tokens row i may
    share (its prompt), held below its length so every row keeps a token of its own;
    `classes[i]`: rows share only within a class (their images, for vision-language rows)."""
    plain_layout(attention_mask)                      # the same refusal of holes / left padding
    lengths = attention_mask.bool().sum(1).tolist()
    B, L = attention_mask.shape
    keys = [ids[i, :max(0, min(int(share_len[i]), lengths[i] - 1))].tolist() for i in range(B)]
    chosen = classed_trees(keys, classes)
    index, positions = [], []
    for tree in chosen:
        for k, row in enumerate(tree.rows):
            start = 0 if k == 0 else tree.prefix
            index.extend(row * L + c for c in range(start, lengths[row]))
            positions.extend(range(start, lengths[row]))
    index_t = torch.tensor(index, dtype=torch.long)
    lay = Layout(index=index_t, positions=torch.tensor(positions, dtype=torch.long),
                 shape=(B, L), source=_source(chosen, index_t, lengths, L))
    return lay, chosen


def _source(chosen: list[Tree], index: torch.Tensor, lengths: list[int], L: int) -> torch.Tensor:
    """(B * L,) packed position of each real token (a shared token: its trunk's), -1 padding."""
    src = flat_source(index, len(lengths) * L)
    for tree in chosen:
        trunk = tree.rows[0]
        for row in tree.rows[1:]:
            src[row * L:row * L + tree.prefix] = src[trunk * L:trunk * L + tree.prefix]
    return src


def saved_tokens(chosen: list[Tree]) -> int:
    """Tokens the trees do not run again: sum of (rows - 1) x prefix."""
    return sum((len(t.rows) - 1) * t.prefix for t in chosen)


def prompt_lengths(response_mask: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(N,) the columns before each row's first response token (its whole length where it has
    none): the most a row may share."""
    resp = (response_mask * attention_mask).bool()
    first = torch.where(resp.any(1), resp.float().argmax(1), attention_mask.bool().sum(1))
    return first.long()


def units(ids: torch.Tensor, share: torch.Tensor, classes: Sequence[Hashable] | None = None,
          groups: Sequence[int] | None = None) -> torch.Tensor:
    """(N,) a unit id per row, numbered in order of first appearance: rows of one GRPO group
    (`groups`: verl's uid; without it, rows with the same first `share` tokens), split further
    by class (images). Mini-batches, ranks and micro-batches keep a unit's rows together so
    that the prefix they share runs once: the whole prompt for PEER's groups, the dialogue
    for ESCRAG-R1's refined prompts."""
    seen: dict[tuple, int] = {}
    out = [seen.setdefault((None if classes is None else classes[i],
                            int(groups[i]) if groups is not None
                            else tuple(ids[i, :int(share[i])].tolist())), len(seen))
           for i in range(len(ids))]
    return torch.tensor(out, dtype=torch.long)


def unit_prefixes(ids: torch.Tensor, share: torch.Tensor, lengths: torch.Tensor,
                  unit: torch.Tensor) -> torch.Tensor:
    """(N,) the tokens a row saves when it runs beside another row of its unit: the prefix
    every row of the unit may share (within `share`, below each row's length), 0 for a unit of
    one. Any two of a unit's rows share at least this much, so a token budget that counts it
    once never undercounts a micro-batch holding part of a unit."""
    cap = torch.minimum(share, lengths - 1).clamp_min(0)
    out = torch.zeros(len(ids), dtype=torch.long)
    members: dict[int, list[int]] = {}
    for i, u in enumerate(unit.tolist()):
        members.setdefault(u, []).append(i)
    for rows in members.values():
        if len(rows) < 2:
            continue
        head = ids[rows[0], :int(cap[rows[0]])].tolist()
        common = min(_common(head, ids[i, :int(cap[i])].tolist()) for i in rows[1:])
        out[rows] = common
    return out
