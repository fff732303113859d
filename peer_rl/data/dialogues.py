"""Which rows are one dialogue: decided here, once, for every job that groups rows by dialogue.

A row holds one moment of a dialogue: its history up to a seeker turn and, in a grpo row, the
supporter reply that came next (`solution`). The opening seeker turn does not tell dialogues
apart: in FailedESConv 70 of its 196 dialogues open with a seeker turn another one opens with
("Hello" 21 times, "hi" 19). So rows are grouped by what they hold (`group_dialogues`):

1. Scope. Rows of different scopes (the caller's: language, source) are never one dialogue.
2. Dialogue id. Rows that carry one (a grpo row's `dialogue`) are grouped by it alone.
3. History. Among the other rows, a later round of a dialogue holds an earlier round's history
   as its beginning. A dialogue is a history that no other row's history continues (the
   longest of its rounds); a row belongs to the dialogue whose history starts with its own.
   Rows with the same history (one round, two candidate replies) go together.
4. Shared openings. A history that more than one dialogue continues (two dialogues that both
   open with "Hello" diverge after it) is not placed by its history. A row whose reply is the
   next turn of exactly one of them joins that one; every other row with that history is left
   unplaced: those rows are a group of their own, marked `ambiguous`, never merged into either
   dialogue, and the jobs count them.

The reply is read only at a shared opening: elsewhere a reference reply worded differently
from the next round's history would split one dialogue into many. The limit: a dialogue the data
holds only as the beginning of one other dialogue is read as part of it. Turns compare by role
and by text with runs of whitespace collapsed (`turn_keys`, which the retrieval's exclusion of
a query's own dialogue, peer_rl.retrieval.index.same_dialogue, uses too).
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


def turn_key(role: str, content) -> str:
    return f"{role}\x00{' '.join(str(content).split())}"


def turn_keys(history: Sequence[dict]) -> tuple[str, ...]:
    """A history as comparable turns (role + whitespace-normalised text)."""
    return tuple(turn_key(t["role"], t["content"]) for t in history)


@dataclass(frozen=True)
class DialogueRow:
    """What the grouping reads of one row."""
    history: Sequence[dict]                 # {role, content} turns
    reply: str | None = None                # the supporter turn that followed (grpo `solution`)
    dialogue: str | None = None             # the data's dialogue id, where it has one
    scope: Hashable = ()                    # rows of different scopes are never one dialogue


@dataclass
class Dialogue:
    rows: list[int]                         # indices into the input, in input order
    ambiguous: bool = False                 # one shared opening's unplaced rows (rule 4)


def group_dialogues(rows: Sequence[DialogueRow]) -> list[Dialogue]:
    """The rows' dialogues (module docstring), ordered by their first row."""
    by_id: dict[tuple, list[int]] = {}
    tries: dict[Hashable, _Node] = {}
    for i, r in enumerate(rows):
        if r.dialogue:
            by_id.setdefault((r.scope, r.dialogue), []).append(i)
            continue
        node = tries.setdefault(r.scope, _Node())
        for key in turn_keys(r.history):
            node = node.children.setdefault(key, _Node())
        node.rows.append(i)
    groups = [Dialogue(members) for members in by_id.values()]
    for root in tries.values():
        groups += _by_history(root, rows)
    return sorted(groups, key=lambda d: d.rows[0])


@dataclass(eq=False)
class _Node:
    """A history in a trie of turns: the rows that end here and the histories going on."""
    children: dict[str, _Node] = field(default_factory=dict)
    rows: list[int] = field(default_factory=list)
    dialogue: object = None      # the one dialogue (a node) continuing it, _MANY, or None


_MANY = object()                 # more than one dialogue continues this history


def _by_history(root: _Node, rows: Sequence[DialogueRow]) -> list[Dialogue]:
    order, stack = [], [root]    # iterative: a history may be longer than Python's recursion
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children.values())
    for node in reversed(order):                 # children before parents
        below = [c.dialogue for c in node.children.values() if c.dialogue is not None]
        if not below:
            node.dialogue = node if node.rows else None     # no row continues it: a dialogue
        elif len(below) == 1:
            node.dialogue = below[0]
        else:
            node.dialogue = _MANY
    placed: dict[int, list[int]] = {}            # id(dialogue node) -> rows
    unplaced: list[list[int]] = []
    for node in order:
        if not node.rows:
            continue
        if node.dialogue is not _MANY:
            placed.setdefault(id(node.dialogue), []).extend(node.rows)
            continue
        left = []
        for i in node.rows:
            reply = rows[i].reply
            nxt = node.children.get(turn_key("supporter", reply)) if reply else None
            target = nxt.dialogue if nxt is not None else None
            if target is None or target is _MANY:
                left.append(i)
            else:
                placed.setdefault(id(target), []).append(i)
        if left:
            unplaced.append(left)
    return ([Dialogue(sorted(members)) for members in placed.values()]
            + [Dialogue(sorted(members), ambiguous=True) for members in unplaced])
