"""Reading a judge's answer the way a person would: which label it gives, or None.

A judge is asked a question and told to answer with one of a few labels (`True`/`False`,
`PASS`/`FAIL`, the four preference phrases). Its answer may negate a label, hedge, quote the
question or say two things. What counts:

| in the answer                              | counts as           | examples                        |
|--------------------------------------------|---------------------|---------------------------------|
| a `<think>` block                          | nothing             | `<think>maybe false</think>True`|
| a sentence ending in `?` / `？`             | nothing (question)  | "Is Step 2 correct?"            |
| different labels joined by or, `/`, `|`, 或, 还是, 、 | nothing (options) | "True or False", "PASS/FAIL"    |
| a label after "whether" / 是否              | nothing (question)  | "是否正确"                       |
| a label                                    | that label          | "The step is true", "正确"       |
| a negated label                            | the opposite        | "not true", "isn't correct", "不正确", "并不正确", "不是正确的" |
| a negated preference                       | only "not that one" | "The first sentence is not better" |
| a hedge in the label's clause, or a clause that is only a hedge | parse failure | "probably true", "True, probably.", "部分正确", "可能正确" |
| labels that disagree                       | parse failure       | "True. Actually, false."        |
| no label                                   | parse failure       | "maybe", ""                     |

Negation: an odd number of `not`, `n't`, `never`, `neither`, `nor`, `fails to` between the
label and the start of its clause (or the previous label), so "not incorrect" is True; in
Chinese 不/没/没有/未/非/无 right before the label, optionally with 是/算/太/够/很/会 (不是正确的),
or inside a preference's own words (第一句并不更好). A clause ends at `, : 、` (and the
sentence's `. ; ! ? \n`) or at but / although / because / 但 / 虽然 / 因为, so "No issues; PASS"
is a pass and "This reply is not safe, FAIL" a fail. "no" is not a negation: it negates a noun
("no issues", "no doubt"). Hedges: maybe, perhaps, probably, possibly, likely, might, could be,
partly, mostly, not sure, not entirely, seems, borderline, ...; 可能, 也许, 大概, 似乎, 部分,
基本, 不完全, ... An answer a person would have to guess at is a parse failure, never a reward.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass


@dataclass(frozen=True)
class Label:
    """One answer and the ways of writing it: `patterns`, each a regex over the normalised
    answer that may have a group `gap` (words inside the label, "the first sentence is NOT
    better") where a negation also counts. A negated label means `opposite` (binary answers)
    or, without one, only "not `value`"."""
    value: object
    patterns: tuple[str, ...]
    opposite: object = None


_SENTENCE = re.compile(r"[^.!?;。！？；\n]*(?:[.!?;。！？；\n]+|$)")
_CLAUSE = re.compile(r"[,:，：、]|\b(?:but|however|although|though|because)\b|但是?|而且?|不过|虽然|"
                     r"因为|尽管")
_CONNECTOR = re.compile(r"[\s\"'“”‘’*`]*(?:\bor\b|/|\||或者?|还是|、)[\s\"'“”‘’*`]*(?:the\s+)?")
_QUESTION_CUE = re.compile(r"(?:\bwhether\b[^,:，：]*|是否)$")
_NEG_EN = re.compile(r"\b(?:not|never|hardly|neither|nor|cannot)\b|n't\b|\bfail(?:s|ed)?\s+to\b")
_NEG_ZH = re.compile(r"(?:不|没有?|未|并非|非|无)(?:是|算|太|够|很|会|一定是)?(?:一个|一句)?$")
_HEDGE = re.compile(
    r"\b(?:maybe|perhaps|probably|possibly|likely|unlikely|might|could\s+be|may\s+be|partly|"
    r"partially|in\s+part|somewhat|mostly|largely|half|unsure|uncertain|unclear|not\s+sure|"
    r"hard\s+to\s+say|can't\s+tell|cannot\s+tell|not\s+entirely|not\s+completely|not\s+fully|"
    r"not\s+quite|kind\s+of|sort\s+of|depends|arguably|seems?|appears?|borderline)\b"
    r"|可能|也许|或许|大概|似乎|好像|不确定|不一定|说不准|说不清|难以判断|很难说|部分|基本|大致|"
    r"不完全|差不多|有点|一半")


@dataclass(frozen=True)
class Mention:
    """A label found in the answer: its value, whether it was negated, whether hedged."""
    label: Label
    negated: bool
    hedged: bool


def strip_think(text: str) -> str:
    """A reasoning model's `<think>...</think>` block is not part of its reply."""
    return re.sub(r"<think>.*?(</think>|$)", "", text, flags=re.DOTALL).strip()


def normalise(text: str) -> str:
    """NFKC (full-width letters become ASCII), lower case, typographic apostrophes plain."""
    return unicodedata.normalize("NFKC", text).lower().replace("’", "'").replace("‘", "'")


def _matches(text: str, labels) -> list[tuple[int, int, Label, re.Match]]:
    found = [(m.start(), m.end(), lab, m) for lab in labels for pattern in lab.patterns
             for m in re.finditer(pattern, text)]
    return sorted(found, key=lambda x: (x[0], -x[1]))


def _blank(text: str, spans) -> str:
    out = list(text)
    for a, b in spans:
        out[a:b] = " " * (b - a)
    return "".join(out)


def _drop_options(text: str, labels) -> str:
    """Blank out option lists ("True or False", "PASS/FAIL", "第一句更好 / 第二句更好 / ..."):
    two different labels with only a connector between them are the question's options, not an
    answer ("False/incorrect" says one thing twice and stays)."""
    found = _matches(text, labels)
    spans = []
    for (a1, b1, l1, _), (a2, b2, l2, _) in zip(found, found[1:]):
        if a2 >= b1 and l1.value != l2.value and _CONNECTOR.fullmatch(text[b1:a2]):
            spans.append((a1, b2))
    return _blank(text, spans)


def _negated(before: str, gap: str) -> bool:
    """An odd count of negations before the label (in its clause, since the last label), or a
    negation inside the label's own words."""
    count = len(_NEG_EN.findall(before)) + bool(_NEG_ZH.search(before))
    return count % 2 == 1 or bool(_NEG_EN.search(gap) or re.search(r"不|没|未|并非", gap))


def _clauses(sentence: str) -> list[tuple[int, int]]:
    """(start, end) of each clause of a sentence whose labels are already blanked."""
    cuts = [m.end() for m in _CLAUSE.finditer(sentence)]
    return list(zip([0] + cuts, cuts + [len(sentence)]))


def mentions(text: str, labels) -> list[Mention]:
    """Every label the answer gives, in order, with its negation and hedge (rules above)."""
    text = _drop_options(normalise(strip_think(text)), labels)
    out = []
    for sm in _SENTENCE.finditer(text):
        sentence = sm.group(0)
        if not sentence.strip() or re.search(r"[?？]\s*$", sentence):
            continue                                   # a question is not an answer
        found = _matches(sentence, labels)
        bare = _blank(sentence, [(a, b) for a, b, _, _ in found])
        clauses = _clauses(bare)
        hedges = [bool(_HEDGE.search(bare[c:d])) for c, d in clauses]
        # a clause that is only a hedge ("True, probably.") hedges its whole sentence
        lone = any(h and not re.search(r"\w", _HEDGE.sub("", bare[c:d]))
                   for h, (c, d) in zip(hedges, clauses))
        last = 0
        for a, b, label, m in found:
            if a < last:
                continue                               # inside a longer label already read
            k = next(i for i, (c, d) in enumerate(clauses) if c <= a < d)
            before = sentence[max(last, clauses[k][0]):a]
            if not _QUESTION_CUE.search(before):
                gap = m.groupdict().get("gap") or ""
                out.append(Mention(label, _negated(before, gap), hedges[k] or lone))
            last = b
    return out


def decide(found: list[Mention]):
    """The one value the mentions agree on, else None: a hedge, two different values, only
    negations of a label with no opposite, or a value the answer also negates."""
    if not found or any(m.hedged for m in found):
        return None
    said, denied = set(), set()
    for m in found:
        if not m.negated:
            said.add(m.label.value)
        elif m.label.opposite is not None:
            said.add(m.label.opposite)
        else:
            denied.add(m.label.value)
    if len(said) != 1 or said & denied:
        return None
    return said.pop()


def read_label(text: str, labels):
    """The label a person reads in `text` (see the module's table), or None."""
    return decide(mentions(text, labels))
