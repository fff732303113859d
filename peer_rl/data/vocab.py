"""The field spellings a PEER-layout file may use, and the one in-memory form they load into.

The PEER data card writes `language: english | chinese` and `modality: textual | visual` on grpo
rows, integer ids on ser rows, and safety histories as "the seeker turns"; files written by
peer-rl's own tools use `en | zh`, `text | visual` and string ids. Both are accepted; every
row is normalised once, at load (peer_rl.data.validate), so the rest of the code sees only:

    language  en | zh          modality  text | visual          id  a string
    history   [{"role": "seeker" | "supporter", "content": str}, ...]
"""
from __future__ import annotations

import re

LANGS = ("en", "zh")
MODALITIES = ("text", "visual")

LANGUAGE_ALIASES = {"en": "en", "english": "en", "zh": "zh", "chinese": "zh"}
MODALITY_ALIASES = {"text": "text", "textual": "text", "visual": "visual", "multimodal": "visual"}
# seeker-side and supporter-side names used by ESConv, ESConv's failed split, chat formats and zh data
ROLE_ALIASES = {
    "seeker": "seeker", "user": "seeker", "usr": "seeker", "speaker": "seeker",
    "client": "seeker", "help-seeker": "seeker", "求助者": "seeker",
    "supporter": "supporter", "assistant": "supporter", "sys": "supporter",
    "listener": "supporter", "counselor": "supporter", "therapist": "supporter",
    "支持者": "supporter",
}

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z]")
# "Seeker: ..." / "求助者：..." at the start of a line of a history given as one string
_ROLE_LINE = re.compile(r"^\s*(" + "|".join(re.escape(k) for k in ROLE_ALIASES) + r")\s*[:：]\s*",
                        re.IGNORECASE | re.MULTILINE)

def language_of(value: str) -> str | None:
    """`en` / `zh` for any accepted spelling (case-insensitive), else None."""
    return LANGUAGE_ALIASES.get(value.strip().lower()) if isinstance(value, str) else None


def modality_of(value: str) -> str | None:
    return MODALITY_ALIASES.get(value.strip().lower()) if isinstance(value, str) else None


def role_of(value: str) -> str | None:
    return ROLE_ALIASES.get(value.strip().lower()) if isinstance(value, str) else None


def infer_language(texts: list[str]) -> str:
    """`zh` when CJK characters outnumber Latin letters in the texts, else `en` (safety rows
    carry no language field; the judge and the policy instruction need one)."""
    joined = "".join(texts)
    return "zh" if len(_CJK.findall(joined)) > len(_LATIN.findall(joined)) else "en"


def split_role_lines(text: str) -> list[dict] | None:
    """A history written as one string with "Seeker: ... / Supporter: ..." lines, as turns;
    None when the string has no role prefixes."""
    marks = list(_ROLE_LINE.finditer(text))
    if not marks or marks[0].start() != len(text) - len(text.lstrip()):
        return None
    turns = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        turns.append({"role": ROLE_ALIASES[m.group(1).lower()], "content": text[m.end():end].strip()})
    return turns
