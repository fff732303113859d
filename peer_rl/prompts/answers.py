"""Reading the parties' answers: a JSON object when the endpoint honoured the schema, else the
number or word where a model usually writes it. Anything else is None: the caller counts it as
a parse failure and the run goes on."""
from __future__ import annotations

import json
import re

from peer_rl.prompts.verdict_text import Label, decide, mentions, strip_think

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


def without_json(text: str) -> str:
    """The answer with every JSON object in it removed: the plain text around a JSON answer."""
    out, pos, start = [], 0, text.find("{")
    while start != -1:
        try:
            _, end = json.JSONDecoder().raw_decode(text[start:])
        except ValueError:
            start = text.find("{", start + 1)
            continue
        out.append(text[pos:start])
        pos = start + end
        start = text.find("{", pos)
    return "".join(out) + text[pos:]


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
    (`"score": 3`, `Score: 3`, `分数：3`, `change = -4`), or a lone number as the whole answer.
    Two different numbers (two labelled ones, or a JSON one and a labelled one in the text
    around it) are ambiguous: None."""
    names = "|".join(re.escape(x) for x in (key,) + labels)
    label = re.compile(rf"(?:{names})\W{{0,4}}?\s*[:：=]?\s*([+-]?\d+)", re.IGNORECASE)
    value = _int_in(json_field(text, key), lo, hi)
    if value is not None:
        around = {_int_in(x, lo, hi) for x in label.findall(without_json(text))}
        return value if around <= {value} else None
    hits = {_int_in(x, lo, hi) for x in label.findall(text)}
    if hits:                       # two different labelled numbers: ambiguous
        return hits.pop() if len(hits) == 1 else None
    m = re.fullmatch(r"\s*([+-]?\d+)\s*[.。]?\s*", text)
    return _int_in(m.group(1), lo, hi) if m else None


VERDICT_LABELS = (
    Label(True, (r"\bpass(?:es|ed)?\b", "通过", "合格"), opposite=False),
    Label(False, (r"\bfail(?:s|ed|ing|ure)?\b(?!\s+to\b)", "失败"), opposite=True),
)


def parse_verdict(text: str) -> bool | None:
    """PASS -> True, FAIL -> False: the JSON field `verdict` unless the text around the JSON
    says otherwise (another verdict, a hedge: None), else the text as a person reads it
    (verdict_text's table: "does not pass" is a fail, "No issues; PASS" a pass)."""
    text = strip_think(text)
    said = mentions(without_json(text), VERDICT_LABELS)
    value = json_field(text, "verdict")
    if isinstance(value, str) and value.strip().upper() in ("PASS", "FAIL"):
        passed = value.strip().upper() == "PASS"
        return passed if not said or decide(said) is passed else None
    return decide(said)


def is_goodbye(text: str) -> bool:
    """The simulated seeker ends the conversation (SAGE stops on a goodbye)."""
    return bool(_GOODBYE.search(text))


def mean(xs) -> float | None:
    xs = [float(x) for x in xs]
    return sum(xs) / len(xs) if xs else None


def value_counts(values) -> dict[str, int]:
    """How often the judge gave each parsed value (None left out), in the value's order: a judge
    that gives one value to everything shows as a single key, and its table tells nothing."""
    counts: dict = {}
    for v in values:
        if v is not None:
            counts[v] = counts.get(v, 0) + 1
    return {str(k): counts[k] for k in sorted(counts)}


def by_language(records: list[dict], dimensions) -> dict:
    """Per language: the case count and each dimension's mean over the scores that parsed."""
    out = {}
    for lang in sorted({r["language"] for r in records}):
        sub = [r for r in records if r["language"] == lang]
        out[lang] = {"cases": len(sub), **{
            d: mean([r["scores"][d] for r in sub if r["scores"][d] is not None])
            for d in dimensions}}
    return out


def complete_cases(records: list[dict], dimensions) -> tuple[list[dict], dict]:
    """The cases whose every dimension parsed, and what the others lack: {"missing": {dimension:
    cases without it}, "incomplete_ids": [...]}. ESC-Eval's and CCJ's averages are taken over
    the complete cases only, so an average always covers every dimension of the same cases
    (averaging each dimension over whichever cases it parsed in mixes case sets, and a case
    with one unparsed dimension would weigh the rest more)."""
    complete, missing, ids = [], {}, []
    for r in records:
        absent = [d for d in dimensions if r["scores"][d] is None]
        if not absent:
            complete.append(r)
            continue
        ids.append(r["id"])
        for d in absent:
            missing[d] = missing.get(d, 0) + 1
    return complete, {"missing": missing, "incomplete_ids": ids}
