"""The judges' answers as a person reads them: a table of phrasings (English and Chinese) with
the verdict written by hand. Negations flip, hedges and contradictions are parse failures
(None), the options of a quoted question are not a verdict."""
import pytest

from peer_rl.prompts.answers import parse_int, parse_verdict
from peer_rl.prompts.verdicts import Preference, parse_preference, parse_step_verdict

F, S, T, N = Preference.FIRST, Preference.SECOND, Preference.TIE, Preference.NEITHER

STEP_TABLE = [
    # plain labels
    ("True", True), ("False.", False), ("**True**", True), ("The step is correct.", True),
    ("This step is wrong.", False), ("正确", True), ("错误。", False), ("这一步是对的。", True),
    # negations
    ("Not true", False), ("This is not true.", False), ("It isn't correct.", False),
    ("The step is not false.", True), ("This is not incorrect.", True),
    ("I don't think this step is true.", False), ("Never true.", False),
    ("不正确", False), ("并不正确。", False), ("这一步不是正确的。", False),
    ("这一步没有错误。", True), ("不是错误的", True), ("没错，这一步分析得很好。", True),
    ("不对", False), ("对。", True), ("答案：错", False), ("不错", None), ("对话很温暖", None),
    # hedges
    ("Probably true.", None), ("Maybe.", None), ("Partly true.", None),
    ("It seems correct.", None), ("I'm not sure it is true.", None),
    ("Not entirely correct.", None), ("可能正确", None), ("部分正确。", None),
    ("基本正确", None), ("也许是错误的", None), ("不完全正确", None),
    ("True, probably.", None), ("True, but maybe not fully.", None),
    # a hedge about something else, in another clause, leaves the verdict alone
    ("True, although the intensity could be higher.", True),
    ("False because it may be anger, not sadness.", False), ("正确，但可能还可以更详细。", True),
    # contradictions
    ("True. Actually, false.", None), ("正确，但也有错误。", None),
    ("Neither true nor false.", None),
    # quoting the question: the options are not a verdict
    ("Is Step 2 correct? True or False? Having checked the emotions, Answer: False", False),
    ("Is this step correct? Answer True or False.\nTrue", True),
    ("True/False: True", True), ("True or False", None), ("True or False?", None),
    ("这一步是否正确？请回答正确或错误。错误", False), ("正确/错误：正确", True),
    ("是否正确", None), ("False/incorrect.", False),
    # a negation does not reach past its clause
    ("It is not a bad step, true.", True), ("No doubt: true.", True),
    ("The seeker does not say why; the step is correct.", True),
    ("", None), ("truely", None),
    # a reasoning model's think block is not its answer
    ("<think>Maybe false? No.</think>True", True),
    # "nothing"/"none" negate what follows ("There is nothing false" says the step is sound)
    ("There is nothing false in this step.", True), ("Nothing is wrong with this step.", True),
    ("None of it is incorrect.", True), ("I don't see anything wrong.", True),
    ("Nothing is missing and the step is correct.", True),
    # negations stacked on a label: two cancel, three are nobody's reading
    ("I wouldn't say it's not correct.", True), ("I wouldn't say it's incorrect.", True),
    ("It is not untrue.", True), ("I don't think it isn't not true.", None),
    ("不是不对", True), ("并非不正确", True), ("并不是不正确的。", True),
    ("这一步没有不正确的地方。", True), ("不是没有错误", False),
    ("没有什么错", True), ("这一步没有什么错误。", True), ("没有任何错误", True), ("没有错。", True),
    # a negated opinion reaches the label as "I don't think" does
    ("我不认为这一步是正确的。", False), ("我不觉得这一步有错误。", True),
    ("我不认为这不是不正确的。", None),
]


@pytest.mark.parametrize("text,expected", STEP_TABLE)
def test_step_verdicts_read_as_a_person_would(text, expected):
    assert parse_step_verdict(text) is expected


VERDICT_TABLE = [
    ('{"verdict": "PASS", "reason": "points to a crisis line"}', True),
    ('{"verdict": "FAIL", "reason": "it does not pass the rule"}', False),
    ("This reply is not safe, FAIL", False), ("No issues; PASS", True),
    ("The reply does not pass.", False), ("It doesn't fail any rule.", True),
    ("The reply fails to pass the check.", False), ("It didn't pass.", False),
    ("FAIL: it gives a method.", False), ("Verdict: PASS", True),
    ("It would probably pass.", None), ("Maybe PASS.", None),
    ("PASS. On reflection, FAIL.", None),
    # JSON and the text around it
    ('{"verdict": "PASS", "reason": "warm"}\nOn reflection, this fails.', None),
    ('{"verdict": "PASS", "reason": "warm"}\nVerdict: PASS', True),
    ('Here is my answer: {"verdict": "FAIL", "reason": "no crisis line"}', False),
    ('{"verdict": "FAIL", "reason": "x"} but it could pass', None),
    # quoting the format
    ('The answer must be "PASS" or "FAIL". The reply gives a method: FAIL', False),
    ("PASS/FAIL: PASS", True), ("pass or fail?", None),
    # Chinese
    ("通过", True), ("不通过。", False), ("未通过", False), ("回复不合格", False),
    ("可能通过", None), ("Result: PASS (borderline)", None),
    ("Nothing in the reply fails the rule: PASS", True), ("I wouldn't say it doesn't pass.", True),
    ("不是不通过", True),
    ('<think>{"verdict": "FAIL"} is the format</think>{"verdict": "PASS", "reason": "ok"}', True),
]


@pytest.mark.parametrize("text,expected", VERDICT_TABLE)
def test_evaluation_verdicts_read_as_a_person_would(text, expected):
    assert parse_verdict(text) is expected


PREFERENCE_TABLE = [
    ("The first sentence is better", F), ("The second sentence is better.", S),
    ("The two sentences are almost good", T), ("Neither sentence is available", N),
    ("第一句更好", F), ("第二句更好。", S), ("差不多", T), ("都不可用", N),
    ("The first sentence is not better", None), ("I don't think the second sentence is better.", None),
    ("The first sentence is not better; the second sentence is better.", S),
    ("The first sentence is warm, but the second sentence is better.", S),
    ("The first sentence is better than the second.", F),
    ("The first sentence is better, though the second could be warmer.", F),
    ("Probably the first sentence is better.", None), ("The first sentence is better, maybe.", None),
    ("The first sentence is better. No wait, the second sentence is better.", None),
    ("第一句并不更好", None), ("可能第二句更好", None),
    ("Which reply is better? Answer with one of: The first sentence is better / The second "
     "sentence is better / The two sentences are almost good / Neither sentence is available."
     "\nThe second sentence is better.", S),
    ("哪条回复更好？请回答：第一句更好 / 第二句更好 / 差不多 / 都不可用。\n第一句更好", F),
    ("The first sentence is better / The second sentence is better", None),
    # comparatives: the reply that is better, or the other one that is worse
    ("第一句比第二句更好", F), ("第二句比第一句更好。", S), ("第一句比第二句好得多。", F),
    ("The first sentence is worse than the second.", S),
    ("The second sentence is not as good as the first.", F),
    ("The first sentence is better than the second, which is worse.", F),
    ("第一句比第二句差", S), ("第一句不如第二句。", S), ("第二句没有第一句好", F),
    # "no better than" is "not that one": a tie or the other, which the judge did not choose
    ("The first sentence is no better than the second.", None),
    ("The second sentence is no worse than the first.", None),
    ("第一句不比第二句好", None), ("第一句并不比第二句更好", None), ("第二句并不比第一句差", None),
    ("The first sentence is no better than the second; the second sentence is better.", S),
    ("The first sentence is no better than the second; the two sentences are almost good.", T),
    ("I don't think the first sentence is not better.", F),
]


@pytest.mark.parametrize("text,expected", PREFERENCE_TABLE)
def test_preferences_read_as_a_person_would(text, expected):
    assert parse_preference(text) is expected


def test_the_table_is_large_and_covers_both_languages():
    rows = STEP_TABLE + VERDICT_TABLE + PREFERENCE_TABLE
    assert len(rows) >= 90
    assert sum(any("\u4e00" <= ch <= "\u9fff" for ch in text) for text, _ in rows) >= 25
    assert sum(expected is None for _, expected in rows) >= 30


@pytest.mark.parametrize("text,expected", [
    ('{"score": 3, "reason": "warm"}', 3),
    ('{"score": 3, "reason": "warm"}\nScore: 1', None),          # JSON and text disagree
    ('{"score": 3, "reason": "warm"} Score: 3', 3),
])
def test_a_json_score_contradicted_by_the_text_is_unparsed(text, expected):
    assert parse_int(text, "score", 0, 4) == expected
