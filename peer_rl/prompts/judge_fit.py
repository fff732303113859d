"""Fit a judge template to SER rows worded differently from the built-in one.

The public SER rows carry only the 9 messages, not the history, steps and replies that were
rendered into them, so the fixed text is found by comparing rows: per language, the system
message is the one most rows share; in each user turn the text common to every row's start and
end is the prefix and suffix, and the longest text common to every row's middle separates the
two fields (history | step in rounds 1-3, first | second in round 4), as the data card lays
the rows out. History utterances are split at the role prefix most of them start with (the
seeker's is the one the last utterance usually has: the replies answer the seeker).

Where the fixed text meets a field, text that every row's field happens to share would be
taken for template text; the fitter gives back partial words, sentence punctuation and a
leading role prefix to the field, which covers the common cases. The result is then checked
row by row (`JudgeTemplate.match`): the rows it cannot reproduce are listed, and the fitted
literals are printed for a person to read before training on them.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from difflib import SequenceMatcher

from peer_rl.prompts.judge import JudgeTemplate, check_rows
from peer_rl.prompts.multimodal import strip_tags

_SENTENCE_END = ".!?。！？…,，;；"
_PREFIX = re.compile(r"^([^\n:：]{1,20}[:：][ \t]?)")


def _common_prefix(strings: list[str]) -> str:
    return os.path.commonprefix(strings)


def _common_suffix(strings: list[str]) -> str:
    return os.path.commonprefix([s[::-1] for s in strings])[::-1]


def _give_back_end(literal: str) -> str:
    """Drop a trailing partial word: it belongs to the field that follows."""
    return re.sub(r"\w+\Z", "", literal)


def _give_back_start(literal: str) -> str:
    """Drop a leading partial word and sentence-final punctuation: they end the field before."""
    return re.sub(rf"^[\w{re.escape(_SENTENCE_END)}]+", "", literal)


def _common_substring(middles: list[str], min_len: int = 2) -> str:
    """The longest text found in every string (blocks shared by the first two, narrowed)."""
    ordered = sorted(middles, key=len)
    a, b = ordered[0], ordered[1] if len(ordered) > 1 else ordered[0]
    sm = SequenceMatcher(None, a, b, autojunk=False)
    candidates = {a[m.a:m.a + m.size] for m in sm.get_matching_blocks() if m.size >= min_len}
    for s in ordered[2:]:
        narrowed = set()
        for c in candidates:
            if c in s:
                narrowed.add(c)
                continue
            sm = SequenceMatcher(None, c, s, autojunk=False)
            narrowed |= {c[m.a:m.a + m.size] for m in sm.get_matching_blocks()
                         if m.size >= min_len}
        candidates = narrowed
        if not candidates:
            return ""
    return max(candidates, key=lambda c: (len(c), c)) if candidates else ""


def _two_fields(turns: list[str]) -> tuple[str, str, str]:
    """(prefix, infix, suffix) of turns laid out prefix + A + infix + B + suffix."""
    prefix = _give_back_end(_common_prefix(turns))
    rest = [t[len(prefix):] for t in turns]
    suffix = _give_back_start(_common_suffix(rest))
    middles = [r[:len(r) - len(suffix)] if suffix else r for r in rest]
    infix = _common_substring(middles)
    return prefix, _give_back_end(_give_back_start(infix)), suffix


def _line_bounded(prefix: str, infix: str, suffix: str) -> tuple[str, str, str]:
    """A history and a step fill whole lines when the fixed text around them breaks lines:
    what the rows share after the last break before a field (or before the first break after
    it) is the field's own text, e.g. a label every step of the data happens to open with."""
    if "\n" in prefix:
        prefix = prefix[:prefix.rindex("\n") + 1]
    if "\n" in infix:
        infix = infix[:infix.rindex("\n") + 1]
    if "\n" in suffix:
        suffix = suffix[suffix.index("\n"):]
    return prefix, infix, suffix


def _escape(literal: str) -> str:
    return literal.replace("{", "{{").replace("}", "}}")


def _separator(histories: list[str]) -> str:
    """The text between utterances: what always precedes an utterance's role prefix inside a
    history (the longest such run of up to 4 characters); a line break when no history has a
    second utterance."""
    firsts = {m.group(1) for m in (_PREFIX.match(h) for h in histories) if m}
    before: list[str] = []
    for h in histories:
        for p in firsts:
            at = h.find(p, 1)
            while at > 0:
                before.append(h[max(0, at - 4):at])
                at = h.find(p, at + 1)
    if not before:
        return "\n"
    sep = ""
    for n in range(1, 5):
        tails = Counter(b[-n:] for b in before if len(b) >= n)
        tail, count = tails.most_common(1)[0] if tails else ("", 0)
        if count < len(before) * 0.9:
            break
        sep = tail
    return sep or "\n"


def _roles(histories: list[str], sep: str) -> dict[str, str]:
    """The seeker and supporter prefixes: the two commonest utterance starts; the seeker's is
    the one the last utterance has more often."""
    starts, last = Counter(), Counter()
    for h in histories:
        pieces = h.split(sep)
        starts.update(m.group(1) for m in (_PREFIX.match(x) for x in pieces) if m)
        m = _PREFIX.match(pieces[-1])
        if m:
            last[m.group(1)] += 1
    top = [p for p, _ in starts.most_common(2)]
    if len(top) < 2:
        raise ValueError("the history could not be split into seeker and supporter utterances "
                         f"(role prefixes found: {top or 'none'})")
    seeker = max(top, key=lambda p: last[p])
    return {"seeker": seeker, "supporter": next(p for p in top if p != seeker)}


def fit_language(rows: list[dict]) -> dict:
    """One language's template entry from its SER rows (at least two)."""
    if len(rows) < 2:
        raise ValueError(f"{len(rows)} row(s): a template is fitted from two rows or more")
    msgs = [r["messages"] for r in rows]
    system = Counter(m[0]["content"] for m in msgs).most_common(1)[0][0]
    steps, histories = [], []
    for k in (1, 2, 3):
        turns = [m[2 * k - 1]["content"] for m in msgs]
        prefix, infix, suffix = _line_bounded(*_two_fields(turns))
        steps.append((prefix, infix, suffix))
        if k == 1 and infix:
            for t in turns:
                body = t[len(prefix):len(t) - len(suffix)]
                histories.append(body.split(infix, 1)[0])
    sep = _separator(histories)
    roles = _roles(histories, sep) if histories else {"seeker": "Seeker: ",
                                                      "supporter": "Supporter: "}
    formats = []
    for prefix, infix, suffix in steps:
        for p in roles.values():      # a history that always opens with one role keeps it
            if prefix.endswith(p):
                prefix = prefix[:-len(p)]
        formats.append(_escape(prefix) + "{history}" + _escape(infix) + "{step}"
                       + _escape(suffix) if infix else _escape(prefix) + "{step}"
                       + _escape(suffix))
    p4, x4, s4 = _two_fields([m[7]["content"] for m in msgs])
    return {"system": system, "steps": formats,
            "preference": _escape(p4) + "{first}" + _escape(x4) + "{second}" + _escape(s4),
            "roles": roles, "turn_separator": sep}


def fit_template(rows: list[tuple[str, dict]]) -> tuple[JudgeTemplate, dict]:
    """(where, row) pairs -> (fitted template, report with per-language counts and the rows
    the template cannot reproduce)."""
    rows = [(w, {**r, "messages": strip_tags(r["messages"])}) for w, r in rows]
    by_lang: dict[str, list[tuple[str, dict]]] = {}
    for where, row in rows:
        by_lang.setdefault(row.get("lang", "en"), []).append((where, row))
    text, report = {}, {"languages": {}}
    for lang, part in sorted(by_lang.items()):
        layout = ["system"] + ["user", "assistant"] * 4
        shaped = [r for _, r in part if [m.get("role") for m in r["messages"]] == layout]
        try:
            text[lang] = fit_language(shaped)
        except ValueError as exc:
            raise ValueError(f"language {lang!r} ({len(part)} row(s), {len(shaped)} with the "
                             f"9-message layout; first {part[0][0]}): {exc}") from None
    template = JudgeTemplate(text=text)
    check = check_rows(template, rows, keep=20)
    for lang, part in sorted(by_lang.items()):
        report["languages"][lang] = {"rows": len(part)}
    report["checked"], report["mismatched"] = check.checked, check.mismatched
    report["examples"] = check.examples
    return template, report
