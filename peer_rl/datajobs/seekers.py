"""SER rows grouped by seeker: one dialogue's rows share its language and opening seeker turn,
and each row's history is a prefix of the longest one (rows are successive turns)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from peer_rl.datajobs.rows import Row, ser_history


@dataclass
class Seeker:
    id: str
    language: str
    history: list[dict]                        # the longest history among its rows
    rows: list[tuple[Row, list[dict]]] = field(default_factory=list)   # (row, its history)

    @property
    def utterances(self) -> list[str]:
        return [t["content"] for t in self.history if t["role"] == "seeker"]


def group_seekers(rows: list[Row]) -> tuple[list[Seeker], int]:
    """Seekers in first-seen order, and how many rows had no readable history."""
    seekers: dict[str, Seeker] = {}
    no_history = 0
    for row in rows:
        history = ser_history(row)
        first = next((t["content"] for t in history or [] if t["role"] == "seeker"), None)
        if first is None:
            no_history += 1
            continue
        lang = row.data["lang"] if "lang" in row.data else row.data["language"]
        sid = "seeker-" + hashlib.sha1(f"{lang}\n{first}".encode()).hexdigest()[:12]
        s = seekers.setdefault(sid, Seeker(sid, lang, history))
        s.rows.append((row, history))
        if len(history) > len(s.history):
            s.history = history
    return list(seekers.values()), no_history
