"""verdict_text's RULES: each rule's examples read as written beside it, and each rule is what
decides at least one of them (the same answers read otherwise with that rule taken out)."""
import re

import pytest

from peer_rl.prompts import verdict_text
from peer_rl.prompts.verdict_text import RULES, mentions
from peer_rl.prompts.verdicts import (PREFERENCE_LABELS, Preference, parse_preference,
                                      parse_step_verdict)

NEVER = re.compile(r"(?!)")


def _reading(answer: str):
    """How the reader takes `answer`, in the examples' words: a step verdict (True, False),
    FIRST, "not FIRST" (a negated FIRST alone), or None."""
    step = parse_step_verdict(answer)
    if step is not None:
        return step
    if parse_preference(answer) is Preference.FIRST:
        return "FIRST"
    if [(m.label.value, m.negated) for m in mentions(answer, PREFERENCE_LABELS)] == \
            [(Preference.FIRST, True)]:
        return "not FIRST"
    return None


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_each_rules_examples_read_as_written(rule):
    assert rule.examples
    for answer, reading in rule.examples:
        assert _reading(answer) == reading, answer


@pytest.mark.parametrize("index", range(len(RULES)), ids=[r.name for r in RULES])
def test_each_rule_decides_one_of_its_examples(index, monkeypatch):
    rule = RULES[index]
    off = RULES[:index] + (verdict_text.Rule(rule.name, rule.does, rule.reads, NEVER, ()),) \
        + RULES[index + 1:]
    monkeypatch.setattr(verdict_text, "RULES", off)
    changed = [a for a, reading in rule.examples if _reading(a) != reading]
    assert changed, f"rule {rule.name!r}: no example reads otherwise without it"


def test_the_rules_are_named_once_and_say_what_they_do():
    names = [r.name for r in RULES]
    assert len(set(names)) == len(names)
    assert {r.does for r in RULES} == {verdict_text.SPLITS_SENTENCES, verdict_text.ENDS_CLAUSE,
                                       verdict_text.DROPS_OPTIONS, verdict_text.CANCELS,
                                       verdict_text.NEGATES, verdict_text.HEDGES}
