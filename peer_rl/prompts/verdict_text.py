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
| a negated label                            | the opposite        | "not true", "isn't correct", "nothing wrong", "不正确", "并不正确", "没有什么错" |
| a label under two negations                | the label           | "not incorrect", "I wouldn't say it's not correct", "并非不正确", "不是不对" |
| a label under three or more negations      | parse failure       | "I don't think it isn't not true" |
| a negated preference                       | only "not that one" | "The first sentence is not better", "第一句不比第二句好" |
| a hedge in the label's clause, or a clause that is only a hedge | parse failure | "probably true", "True, probably.", "部分正确", "可能正确" |
| labels that disagree                       | parse failure       | "True. Actually, false."        |
| no label                                   | parse failure       | "maybe", ""                     |

Negations are counted between the label and the start of its clause (or the previous label):
`not`, `n't`, `never`, `neither`, `nor`, `fails to`, ... anywhere there, and `nothing`, `none`
unless a second predicate follows ("nothing is missing and it is correct" is True); in Chinese
不/没/没有/未/非/无/并非 stacked right before the label, each optionally with 是/算/太/够/很/会 and
什么/任何 (不是正确的, 并非不正确, 没有任何错误), and 不认为/不觉得/不能说 ... anywhere there
("I don't think"); and those inside a preference's own words (第一句并不比第二句好). An odd
count negates, two cancel, three or more are more than a reader untangles. A clause ends at
`, : 、` (and the sentence's `. ; ! ? \n`) or at but / although / because / 但 / 虽然 / 因为, so
"No issues; PASS" is a pass and "This reply is not safe, FAIL" a fail. "no" is not a negation:
it negates a noun ("no issues", "no doubt"), except before a comparative ("no better than").

A preference is read from one reply named and judged (the label sets are in peer_rl.algos.rewards): "the
first ... better (than the second)", "第一句比第二句更好" and "the second is worse / not as good
as the first", "第二句不如第一句", "第二句没有第一句好" all say FIRST. "The first is no better
(not better) than the second" says only "not FIRST": it could be a tie or the second, so alone
it is a parse failure, never read as the tie label the judge did not give.

Hedges: maybe, perhaps, probably, possibly, likely, might, could be, partly, mostly, not sure,
not entirely, seems, borderline, ...; 可能, 也许, 大概, 似乎, 部分, 基本, 不完全, ... An answer a
person would have to guess at is a parse failure, never a reward.
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
# "nothing" negates the label it leads to ("nothing is wrong", "nothing in it is false"), not
# one past a second predicate ("nothing is missing and the step is correct")
_NEG_NOTHING = re.compile(r"\b(?:nothing|none|nowhere)\b(?!.*\b(?:and|so|thus|therefore|hence|"
                          r"also|then|yet|plus)\b)", re.DOTALL)
# "no" negates a noun ("no issues"), except right before a comparative ("no better than")
_NO_COMPARATIVE = re.compile(r"\bno\s*$")
# Chinese negations stacked right before a label, each optionally followed by 是/算/... and
# 什么/任何 (并非不正确, 不是不对, 没有什么错误)
_NEG_ZH = re.compile(r"(?:(?:并非|并不|并没有?|不|没有?|未|非|毫无|无)(?:是|算|太|够|很|会|一定是|存在)?"
                     r"(?:什么|任何|啥)?(?:一个|一句)?)+$")
_NEG_ZH_WORD = re.compile(r"并非|并不|并没|不(?!仅|只|但|过)|没|未|非|无")
# inside a label's own words (第一句并不比第二句好) only these count: 无 and 非 there are more
# often 无疑 ("no doubt") and 非常 ("very")
_NEG_ZH_GAP = re.compile(r"并非|并不|并没|不(?!仅|只|但|过)|没|未")
# a negated opinion anywhere before the label, as English "I don't think": 我不认为这一步是正确的
_NEG_ZH_OPINION = re.compile(r"(?:并?不|没有?)(?:认为|觉得|相信|同意|以为|能说|可以说)")
MAX_NEGATIONS = 2       # two cancel ("not incorrect", 并非不正确); three are nobody's reading
_HEDGE = re.compile(
    r"\b(?:maybe|perhaps|probably|possibly|likely|unlikely|might|could\s+be|may\s+be|partly|"
    r"partially|in\s+part|somewhat|mostly|largely|half|unsure|uncertain|unclear|not\s+sure|"
    r"hard\s+to\s+say|can't\s+tell|cannot\s+tell|not\s+entirely|not\s+completely|not\s+fully|"
    r"not\s+quite|kind\s+of|sort\s+of|depends|arguably|seems?|appears?|borderline)\b"
    r"|可能|也许|或许|大概|似乎|好像|不确定|不一定|说不准|说不清|难以判断|很难说|部分|基本|大致|"
    r"不完全|差不多|有点|一半")


@dataclass(frozen=True)
class Mention:
    """A label found in the answer: its value, whether it was negated, and whether it is
    unclear (hedged, or under more negations than a reader untangles)."""
    label: Label
    negated: bool
    unclear: bool


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


def negations(before: str, gap: str) -> int:
    """How many negations a label is under: those before it in its clause (since the last
    label), the Chinese ones stacked right before it, and those inside its own words."""
    zh = _NEG_ZH.search(before)
    return (len(_NEG_EN.findall(before)) + len(_NEG_EN.findall(gap))
            + len(_NEG_NOTHING.findall(before))
            + bool(_NO_COMPARATIVE.search(gap))
            + (len(_NEG_ZH_WORD.findall(zh.group(0))) if zh else 0)
            + len(_NEG_ZH_OPINION.findall(before))
            + len(_NEG_ZH_GAP.findall(gap)))


def _clauses(sentence: str) -> list[tuple[int, int]]:
    """(start, end) of each clause of a sentence whose labels are already blanked."""
    cuts = [m.end() for m in _CLAUSE.finditer(sentence)]
    return list(zip([0] + cuts, cuts + [len(sentence)]))


def mentions(text: str, labels) -> list[Mention]:
    """Every label the answer gives, in order, negated or not, clear or not (rules above)."""
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
                n = negations(before, m.groupdict().get("gap") or "")
                out.append(Mention(label, n % 2 == 1,
                                   hedges[k] or lone or n > MAX_NEGATIONS))
            last = b
    return out


def decide(found: list[Mention]):
    """The one value the mentions agree on, else None: an unclear mention, two different
    values, only negations of a label with no opposite, or a value the answer also negates."""
    if not found or any(m.unclear for m in found):
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
