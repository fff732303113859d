"""Cleaning what a simulated seeker writes before the supporter reads it."""
from __future__ import annotations

import re

from peer_rl.evaluation.parse import strip_think

_PREFIX = re.compile(r"^\s*(?:seeker|user|me|求助者|我)\s*[:：]\s*", re.IGNORECASE)
_QUOTES = (('"', '"'), ("'", "'"), ("“", "”"), ("「", "」"))


def seeker_line(text: str) -> str:
    """The message alone: no reasoning block, no `Seeker:` prefix, no wrapping quotes."""
    text = _PREFIX.sub("", strip_think(text)).strip()
    for left, right in _QUOTES:
        if len(text) > 1 and text.startswith(left) and text.endswith(right):
            text = text[1:-1].strip()
    return text
