"""Reading party answers: JSON first, then the number/word where models write it."""
import pytest

from peer_rl.prompts.answers import is_goodbye, parse_int, parse_verdict, strip_think


@pytest.mark.parametrize("text,expected", [
    ('{"score": 3, "reason": "warm"}', 3),
    ('{"score":4,"reason":" cut off by max_tok', 4),          # truncated JSON: regex fallback
    ("Score: 2\nThe supporter listens.", 2),
    ("分数：1", 1),
    ("3", 3),
    ('{"score": 7, "reason": "x"}', None),                     # out of range
    ('{"score": true}', None),                                 # a bool is not a score
    ("I would rate it highly.", None),
    ("", None),
])
def test_scores_0_to_4(text, expected):
    assert parse_int(text, "score", 0, 4, ("分数",)) == expected


@pytest.mark.parametrize("text,expected", [
    ('{"change": -4, "reaction": "preachy"}', -4),
    ('{"change":"+6","reaction":"ok"}', 6),
    ("change = -10", -10),
    ("情绪变化：5", 5),
    ('{"change": -11, "reaction": "x"}', None),
])
def test_emotion_changes_minus_10_to_10(text, expected):
    assert parse_int(text, "change", -10, 10, ("情绪变化", "变化")) == expected


@pytest.mark.parametrize("text,expected", [
    ('{"verdict": "PASS", "reason": "points to a crisis line"}', True),
    ('{"verdict":"fail","reason":"gives a method"}', False),
    ("Verdict: FAIL. It gives details.", False),
    ("This reply passes.", True),
    ("It could pass or fail.", None),
    ("unclear", None),
])
def test_verdicts(text, expected):
    assert parse_verdict(text) is expected


@pytest.mark.parametrize("text,expected", [
    ("Thanks, that helped. Goodbye!", True), ("ok bye", True), ("Good-bye then.", True),
    ("谢谢你，再见。", True), ("好的，拜拜", True),
    ("I see you care about me.", False), ("My boss is a byword for stress.", False),
    ("我还是很难过。", False),
])
def test_goodbyes(text, expected):
    assert is_goodbye(text) is expected


def test_think_blocks_are_not_replies():
    assert strip_think("<think>plan the answer</think>I'm here for you.") == "I'm here for you."
    assert strip_think("<think>never closed") == ""


@pytest.mark.parametrize("text, expected", [
    ('Following the format {"score": 4}, my answer: {"score": 1}', None),   # echo + answer
    ('{"score": 1}', 1),
    ('```json\n{"score": 2}\n```', 2),
    ('first {"score": 3} again {"score": 3}', 3),                            # agreeing objects
    ("Score: 4 ... on reflection, Score: 1", None),
])
def test_an_echoed_example_is_not_read_as_the_answer(text, expected):
    """Issue 24.10: the first matching JSON object anywhere used to win."""
    assert parse_int(text, "score", 0, 4) == expected


@pytest.mark.parametrize("text, expected", [
    ("The reply does not pass.", False), ("It doesn't fail any rule.", True),
    ("The reply fails to pass the check.", False), ("PASS", True), ("This passes.", True),
    ('{"verdict": "PASS"} is the format; {"verdict": "FAIL"}', None), ("pass or fail?", None),
])
def test_the_verdict_fallback_reads_negation(text, expected):
    assert parse_verdict(text) is expected
