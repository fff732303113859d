"""SER rows grouped by seeker: one seeker per dialogue (peer_rl.data.dialogues.group_dialogues,
within a language and source; an SER row carries no dialogue id and no reply that continues it,
so its history decides). Every row's history is a beginning of its seeker's longest one, so one
rewrite of the longest history covers each row."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from peer_rl.data.dialogues import DialogueRow, group_dialogues, turn_keys
from peer_rl.datajobs.rows import Row, ser_history


@dataclass
class Seeker:
    id: str
    language: str
    history: list[dict]                        # the longest history among its rows
    rows: list[tuple[Row, list[dict]]] = field(default_factory=list)   # (row, its history)
    ambiguous: bool = False                    # rows of a shared opening (group_dialogues)

    @property
    def utterances(self) -> list[str]:
        return [t["content"] for t in self.history if t["role"] == "seeker"]


def group_seekers(rows: list[Row]) -> tuple[list[Seeker], int]:
    """Seekers in the order of their first row, and how many rows had no readable history."""
    read = [(row, ser_history(row)) for row in rows]
    read = [(row, h) for row, h in read if h and any(t["role"] == "seeker" for t in h)]
    scopes = [(_lang(row), row.data["source"]) for row, _ in read]
    groups = group_dialogues([DialogueRow(h, scope=s) for (_, h), s in zip(read, scopes)])
    seekers = []
    for g in groups:
        members = [read[i] for i in g.rows]
        history = max((h for _, h in members), key=len)
        lang, source = scopes[g.rows[0]]
        key = "\n".join((lang, source, *turn_keys(history)))
        sid = "seeker-" + hashlib.sha1(key.encode()).hexdigest()[:12]
        seekers.append(Seeker(sid, lang, history, members, g.ambiguous))
    return seekers, len(rows) - len(read)


def _lang(row: Row) -> str:
    return row.data["lang"] if "lang" in row.data else row.data["language"]
