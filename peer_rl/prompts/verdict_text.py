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

How each wording does that is the table RULES below: each rule named, its pattern, what
it does (splits sentences or clauses, drops an option list, cancels a label, negates, hedges),
the text it reads, and answers it decides with how a person reads them. An odd count of
negations negates, two cancel, three or more are more than a reader untangles.

A preference is read from one reply named and judged (the label sets are in
peer_rl.prompts.verdicts): "the first ... better (than the second)", "第一句比第二句更好" and
"the second is worse / not as good as the first", "第二句不如第一句", "第二句没有第一句好" all
say FIRST. "The first is no better
(not better) than the second" says only "not FIRST": it could be a tie or the second, so alone
it is a parse failure, never read as the tie label the judge did not give.
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


# What a rule does, and the text it reads
SPLITS_SENTENCES = "splits the answer into sentences"
ENDS_CLAUSE = "ends a clause, the reach of a negation or a hedge"
DROPS_OPTIONS = "drops two different labels it joins: the question's options, not an answer"
CANCELS = "cancels: a question, not an answer"
NEGATES = "negates, each match once (or each `unit` in it)"
HEDGES = "hedges the clause: its labels are unclear"
ANSWER, SENTENCE, BETWEEN, BEFORE, GAP, CLAUSE = (
    "the answer", "a sentence", "the text between two labels",
    "the label's clause up to it (since the previous label)",
    "the label's own words (`gap`: the first sentence IS NOT better)", "each clause")


@dataclass(frozen=True)
class Rule:
    """One way the wording around a label changes what it says. `examples`: answers it
    decides, each with how a person reads it (True/False: a step verdict; FIRST or "not
    FIRST": a preference; None: a parse failure); tests/prompts/test_verdict_rules.py reads
    them and checks that each rule decides at least one of its own."""
    name: str
    does: str
    reads: tuple[str, ...]
    pattern: re.Pattern
    examples: tuple[tuple[str, object], ...]
    unit: re.Pattern | None = None     # what one negation is inside a match (stacked ones)

    def count(self, text: str) -> int:
        """How many times the rule applies to `text`."""
        if self.unit is None:
            return sum(1 for _ in self.pattern.finditer(text))
        return sum(len(self.unit.findall(m.group(0))) for m in self.pattern.finditer(text))


_ZH_NEG_WORD = r"并非|并不|并没|不(?!仅|只|但|过)|没|未"
RULES = (
    Rule("sentence", SPLITS_SENTENCES, (ANSWER,),
         re.compile(r"[^.!?;。！？；\n]*(?:[.!?;。！？；\n]+|$)"),
         (("True. Actually, false.", None), ("No step is missing; true.", True))),
    Rule("clause", ENDS_CLAUSE, (SENTENCE,),
         re.compile(r"[,:，：、]|\b(?:but|however|although|though|because)\b|但是?|而且?|不过|虽然|"
                    r"因为|尽管"),
         (("It is not a bad step, true.", True), ("The reply is not warm, but it is correct.", True),
          ("True, although the intensity could be higher.", True),
          ("正确，但可能还可以更详细。", True))),
    Rule("options", DROPS_OPTIONS, (BETWEEN,),
         re.compile(r"[\s\"'“”‘’*`]*(?:\bor\b|/|\||或者?|还是|、)[\s\"'“”‘’*`]*(?:the\s+)?"),
         (("True or False", None), ("True/False: True", True), ("正确/错误：正确", True),
          ("这一步是否正确？请回答正确或错误。错误", False), ("False/incorrect.", False))),
    Rule("question", CANCELS, (SENTENCE,), re.compile(r"[?？]\s*$"),
         (("Is Step 2 correct? True or False? Having checked the emotions, Answer: False", False),
          ("True or False?", None))),
    Rule("whether", CANCELS, (BEFORE,), re.compile(r"(?:\bwhether\b[^,:，：]*|是否)$"),
         (("是否正确", None), ("I was asked whether the step is true. It is false.", False))),
    Rule("not", NEGATES, (BEFORE, GAP),
         re.compile(r"\b(?:not|never|hardly|neither|nor|cannot)\b|n't\b|\bfail(?:s|ed)?\s+to\b"),
         (("Not true", False), ("It isn't correct.", False), ("This is not incorrect.", True),
          ("I wouldn't say it's not correct.", True), ("I don't think it isn't not true.", None),
          ("Neither true nor false.", None), ("No doubt: true.", True),
          ("The first sentence is not better", "not FIRST"))),
    # "nothing" negates the label it leads to ("nothing is wrong", "nothing in it is false"),
    # not one past a second predicate ("nothing is missing and the step is correct")
    Rule("nothing", NEGATES, (BEFORE,),
         re.compile(r"\b(?:nothing|none|nowhere)\b(?!.*\b(?:and|so|thus|therefore|hence|also|"
                    r"then|yet|plus)\b)", re.DOTALL),
         (("Nothing is wrong with this step.", True), ("None of it is incorrect.", True),
          ("Nothing is missing and the step is correct.", True))),
    # "no" negates a noun ("no issues", "no doubt"), except right before a comparative
    Rule("no better", NEGATES, (GAP,), re.compile(r"\bno\s*$"),
         (("The first sentence is no better than the second.", "not FIRST"),)),
    # Chinese negations stacked right before a label, each optionally followed by 是/算/... and
    # 什么/任何; each negation word in the stack counts
    Rule("不/没 stacked", NEGATES, (BEFORE,),
         re.compile(r"(?:(?:并非|并不|并没有?|不|没有?|未|非|毫无|无)(?:是|算|太|够|很|会|一定是|存在)?"
                    r"(?:什么|任何|啥)?(?:一个|一句)?)+$"),
         (("不正确", False), ("并不正确。", False), ("这一步没有错误。", True), ("并非不正确", True),
          ("不是不对", True), ("没有任何错误", True), ("不是没有错误", False)),
         unit=re.compile(_ZH_NEG_WORD + r"|非|无")),
    # a negated opinion anywhere before the label, as English "I don't think"
    Rule("不认为", NEGATES, (BEFORE,),
         re.compile(r"(?:并?不|没有?)(?:认为|觉得|相信|同意|以为|能说|可以说)"),
         (("我不认为这一步是正确的。", False), ("我不觉得这一步有错误。", True),
          ("我不认为这不是不正确的。", None))),
    # inside a label's own words only these count: 无 and 非 there are more often 无疑 ("no
    # doubt") and 非常 ("very")
    Rule("不/没 inside", NEGATES, (GAP,), re.compile(_ZH_NEG_WORD),
         (("没有什么错", True), ("第一句并不比第二句更好", "not FIRST"), ("第一句不比第二句好", "not FIRST"))),
    Rule("hedge", HEDGES, (CLAUSE,),
         re.compile(r"\b(?:maybe|perhaps|probably|possibly|likely|unlikely|might|could\s+be|"
                    r"may\s+be|partly|partially|in\s+part|somewhat|mostly|largely|half|unsure|"
                    r"uncertain|unclear|not\s+sure|hard\s+to\s+say|can't\s+tell|cannot\s+tell|"
                    r"not\s+entirely|not\s+completely|not\s+fully|not\s+quite|kind\s+of|sort\s+of|"
                    r"depends|arguably|seems?|appears?|borderline)\b"
                    r"|可能|也许|或许|大概|似乎|好像|不确定|不一定|说不准|说不清|难以判断|很难说|部分|基本|"
                    r"大致|不完全|差不多|有点|一半"),
         (("Probably true.", None), ("Partly true.", None), ("Not entirely correct.", None),
          ("True, probably.", None), ("可能正确", None), ("部分正确。", None),
          ("True, although the intensity could be higher.", True))),
)
MAX_NEGATIONS = 2       # two cancel ("not incorrect", 并非不正确); three are nobody's reading


def rule(does: str) -> Rule:
    """The one rule that does `does` (splitting, dropping options)."""
    (found,) = (r for r in RULES if r.does == does)
    return found


def applies(does: str, reads: str, text: str) -> int:
    """How many times the rules that do `does` and read `reads` apply to `text`."""
    return sum(r.count(text) for r in RULES if r.does == does and reads in r.reads)


def _without(does: str, text: str) -> str:
    """`text` with what the rules that do `does` match taken out."""
    for r in RULES:
        if r.does == does:
            text = r.pattern.sub("", text)
    return text


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
    found, joins = _matches(text, labels), rule(DROPS_OPTIONS).pattern
    spans = []
    for (a1, b1, l1, _), (a2, b2, l2, _) in zip(found, found[1:]):
        if a2 >= b1 and l1.value != l2.value and joins.fullmatch(text[b1:a2]):
            spans.append((a1, b2))
    return _blank(text, spans)


def negations(before: str, gap: str) -> int:
    """How many negations a label is under: those before it in its clause (since the last
    label), the Chinese ones stacked right before it, and those inside its own words."""
    return applies(NEGATES, BEFORE, before) + applies(NEGATES, GAP, gap)


def _clauses(sentence: str) -> list[tuple[int, int]]:
    """(start, end) of each clause of a sentence whose labels are already blanked."""
    cuts = [m.end() for m in rule(ENDS_CLAUSE).pattern.finditer(sentence)]
    return list(zip([0] + cuts, cuts + [len(sentence)]))


def mentions(text: str, labels) -> list[Mention]:
    """Every label the answer gives, in order, negated or not, clear or not (rules above)."""
    text = _drop_options(normalise(strip_think(text)), labels)
    out = []
    for sm in rule(SPLITS_SENTENCES).pattern.finditer(text):
        sentence = sm.group(0)
        if not sentence.strip() or applies(CANCELS, SENTENCE, sentence):
            continue                                   # a question is not an answer
        found = _matches(sentence, labels)
        bare = _blank(sentence, [(a, b) for a, b, _, _ in found])
        clauses = _clauses(bare)
        hedges = [bool(applies(HEDGES, CLAUSE, bare[c:d])) for c, d in clauses]
        # a clause that is only a hedge ("True, probably.") hedges its whole sentence
        lone = any(h and not re.search(r"\w", _without(HEDGES, bare[c:d]))
                   for h, (c, d) in zip(hedges, clauses))
        last = 0
        for a, b, label, m in found:
            if a < last:
                continue                               # inside a longer label already read
            k = next(i for i, (c, d) in enumerate(clauses) if c <= a < d)
            before = sentence[max(last, clauses[k][0]):a]
            if not applies(CANCELS, BEFORE, before):
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
