"""Reading the parties' answers: a JSON object when the endpoint honoured the schema, else the
number or word where a model usually writes it. Anything else is None: the caller counts it as
a parse failure and the run goes on."""
from __future__ import annotations

import json
import re

_GOODBYE = re.compile(r"\b(good\s*-?\s*bye|bye(?:\s*bye)?|farewell)\b|再见|拜拜|回头见",
                      re.IGNORECASE)


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)
_NONE = object()


def json_field(text: str, key: str):
    """`key` of the answer's JSON object: the whole answer when it is one (a schema-constrained
    answer always is; a ```json fence is allowed), else the objects inside it, which must all
    agree: a judge that echoes an example object before its own answer is unparsed (None), not
    read as the example."""
    m = _FENCE.match(text)
    whole = m.group(1) if m else text.strip()
    try:
        obj = json.loads(whole)
        if isinstance(obj, dict):
            return obj.get(key)
    except ValueError:
        pass
    found, start = [], text.find("{")
    while start != -1:
        try:
            obj, end = json.JSONDecoder().raw_decode(text[start:])
            if isinstance(obj, dict) and key in obj:
                found.append(obj[key])
            start = text.find("{", start + max(end, 1))
            continue
        except ValueError:
            pass
        start = text.find("{", start + 1)
    distinct = {json.dumps(v, sort_keys=True) for v in found}
    return found[0] if len(distinct) == 1 else None


def _int_in(value, lo: int, hi: int) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and float(value).is_integer():
        value = int(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        value = int(value)
    else:
        return None
    return value if lo <= value <= hi else None


def parse_int(text: str, key: str, lo: int, hi: int, labels: tuple[str, ...] = ()) -> int | None:
    """An integer in [lo, hi]: the JSON field `key`, or the number after `key`/a label
    (`"score": 3`, `Score: 3`, `分数：3`, `change = -4`), or a lone number as the whole answer."""
    value = _int_in(json_field(text, key), lo, hi)
    if value is not None:
        return value
    names = "|".join(re.escape(x) for x in (key,) + labels)
    hits = {_int_in(x, lo, hi) for x in
            re.findall(rf"(?:{names})\W{{0,4}}?\s*[:：=]?\s*([+-]?\d+)", text, re.IGNORECASE)}
    if hits:                       # two different labelled numbers: ambiguous
        return hits.pop() if len(hits) == 1 else None
    m = re.fullmatch(r"\s*([+-]?\d+)\s*[.。]?\s*", text)
    return _int_in(m.group(1), lo, hi) if m else None


def parse_verdict(text: str) -> bool | None:
    """PASS -> True, FAIL -> False: the JSON field `verdict`, else the one of the two words the
    answer uses (None when it uses neither or both)."""
    value = json_field(text, "verdict")
    if isinstance(value, str) and value.strip().upper() in ("PASS", "FAIL"):
        return value.strip().upper() == "PASS"
    said = set()
    for m in _VERDICT_WORD.finditer(text):
        passed = m.group("word").lower() == "pass"
        said.add(passed != bool(m.group("neg")))      # "does not pass" is a fail
    return said.pop() if len(said) == 1 else None


# PASS / FAIL with a negation up to three words before it: "does not pass", "didn't fail"
_VERDICT_WORD = re.compile(
    r"(?P<neg>\b(?:not|never|no|cannot|can't|won't|doesn't|does\s+not|didn't|isn't|fails?\s+to)"
    r"\b(?:\W+\w+){0,2}?\W+)?\b(?P<word>pass|fail)(?:es|ed|s)?\b", re.IGNORECASE)


def is_goodbye(text: str) -> bool:
    """The simulated seeker ends the conversation (SAGE stops on a goodbye)."""
    return bool(_GOODBYE.search(text))


def strip_think(text: str) -> str:
    """A reasoning model's `<think>...</think>` block is not part of its reply."""
    return re.sub(r"<think>.*?(</think>|$)", "", text, flags=re.DOTALL).strip()


def mean(xs) -> float | None:
    xs = [float(x) for x in xs]
    return sum(xs) / len(xs) if xs else None


def by_language(records: list[dict], dimensions) -> dict:
    """Per language: the case count and each dimension's mean over the scores that parsed."""
    out = {}
    for lang in sorted({r["language"] for r in records}):
        sub = [r for r in records if r["language"] == lang]
        out[lang] = {"cases": len(sub), **{
            d: mean([r["scores"][d] for r in sub if r["scores"][d] is not None])
            for d in dimensions}}
    return out
