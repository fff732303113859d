"""Reading the data jobs' answers: the JSON object the schema asks for, else the fields where a
model usually writes them in text. Anything else is None: the job sets that row aside and
counts it, it never guesses a verdict."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from peer_rl.datajobs.prompts import CRITERIA, DISC, STAGES
from peer_rl.prompts.answers import json_field, parse_int, strip_think

_YES = {"true", "yes", "y", "1", "是", "有", "存在"}
_NO = {"false", "no", "n", "0", "否", "无", "没有", "不存在"}


def _object(text: str) -> dict | None:
    """The first JSON object in the text (a reasoning model's <think> block skipped)."""
    text = strip_think(text)
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = json.JSONDecoder().raw_decode(text[start:])
            if isinstance(obj, dict):
                return obj
        except ValueError:
            pass
        start = text.find("{", start + 1)
    return None


def _flag(value) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _YES | _NO:
        return value.strip().lower() in _YES
    return None


@dataclass(frozen=True)
class FilterVerdict:
    flags: dict          # criterion -> bool
    reason: str

    @property
    def remove(self) -> bool:
        return any(self.flags.values())

    @property
    def criteria(self) -> list[str]:
        return [c for c in CRITERIA if self.flags[c]]


def parse_filter(text: str) -> FilterVerdict | None:
    """All three criteria as booleans (JSON, or `semantic_incoherence: yes` lines); a missing
    or unreadable criterion makes the whole verdict None."""
    obj = _object(text) or {}
    flags = {c: _flag(obj.get(c)) for c in CRITERIA}
    for c in CRITERIA:
        if flags[c] is None:
            m = re.search(rf"{c.replace('_', '[ _-]?')}\W{{0,3}}\s*[:：=]\s*\"?(\w+)", text,
                          re.IGNORECASE)
            flags[c] = _flag(m.group(1)) if m else None
    if any(v is None for v in flags.values()):
        return None
    reason = obj.get("reason")
    if not isinstance(reason, str):
        m = re.search(r"reason\W{0,3}\s*[:：=]\s*\"?([^\n\"]+)", text, re.IGNORECASE)
        reason = m.group(1).strip() if m else ""
    return FilterVerdict(flags, reason.strip())


@dataclass(frozen=True)
class Persona:
    disc: dict           # dimension -> 1..5
    description: str


def parse_persona(text: str) -> Persona | None:
    disc = {d: parse_int(text, d, 1, 5) for d in DISC}
    desc = json_field(strip_think(text), "description")
    if not isinstance(desc, str):
        m = re.search(r"description\W{0,3}\s*[:：=]\s*\"?([^\n\"]+)", text, re.IGNORECASE)
        desc = m.group(1) if m else ""
    if any(v is None for v in disc.values()) or not desc.strip():
        return None
    return Persona(disc, desc.strip())


def parse_rewrite(text: str, n: int) -> list[str] | None:
    """Exactly `n` non-empty rewritten messages: the JSON `turns` list, or `1. ...` lines."""
    turns = (_object(text) or {}).get("turns")
    if not isinstance(turns, list):
        turns = re.findall(r"^\s*\d+[.)、]\s*(.+?)\s*$", strip_think(text), re.MULTILINE)
    if len(turns) != n or not all(isinstance(t, str) and t.strip() for t in turns):
        return None
    return [t.strip() for t in turns]


def parse_candidate(text: str) -> dict | None:
    """A counsellor candidate: the three stages and the reply (the reply must be non-empty)."""
    obj = _object(text)
    if obj is None or not isinstance(obj.get("reply"), str) or not obj["reply"].strip():
        return None
    return {**{s: str(obj.get(s) or "").strip() for s in STAGES}, "reply": obj["reply"].strip()}


def parse_note(text: str) -> str | None:
    """One stage's note ({"note": ...}), non-empty."""
    obj = _object(text)
    note = obj.get("note") if obj else None
    return note.strip() if isinstance(note, str) and note.strip() else None


def parse_reply(text: str) -> str | None:
    """A reply written after the chosen stage notes ({"reply": ...}), non-empty."""
    obj = _object(text)
    reply = obj.get("reply") if obj else None
    return reply.strip() if isinstance(reply, str) and reply.strip() else None


def parse_pick(text: str, n: int) -> int | None:
    """The judge's choice among n numbered options ({"best": k}, 1-based) -> a 0-based index."""
    obj = _object(text)
    best = obj.get("best") if obj else None
    if isinstance(best, bool) or not isinstance(best, (int, str)):
        return None
    try:
        k = int(best)
    except ValueError:
        return None
    return k - 1 if 1 <= k <= n else None
