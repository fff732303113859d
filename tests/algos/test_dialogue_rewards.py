"""The seeker's emotion rules (peer_rl.algos.emotion) and the advantages of whole conversations
(peer_rl.algos.turn_credit), against values worked out by hand."""
import numpy as np
import pytest

from peer_rl.algos.emotion import EmotionRules, emotion_end, emotion_reward, next_emotion
from peer_rl.algos.turn_credit import dialogue_advantages

R2 = 1 / np.sqrt(2)        # two values a, b: (a - mean) / unbiased std = +-1/sqrt(2)


def test_a_turn_moves_the_emotion_by_its_change_held_to_the_range():
    assert next_emotion(40, 7) == 47
    assert next_emotion(40, None) == 40            # unparseable: no change
    assert next_emotion(40, 25) == 50              # at most 10 a turn
    assert next_emotion(40, -25) == 30
    assert next_emotion(95, 10) == 100 and next_emotion(5, -10) == 0
    assert next_emotion(40, 25, EmotionRules(max_change=20)) == 60


def test_the_emotion_ends_the_dialogue_at_100_and_below_10():
    assert emotion_end(100) == "success"
    assert emotion_end(9) == "failure"
    assert emotion_end(10) is None and emotion_end(99) is None
    assert emotion_end(80, EmotionRules(high=80)) == "success"
    assert emotion_reward(70) == pytest.approx(0.7) and emotion_reward(0) == 0.0


def test_emotion_rules_out_of_range_are_refused():
    with pytest.raises(ValueError, match="0 <= low < high <= 100"):
        EmotionRules(low=50, high=40)
    with pytest.raises(ValueError, match="max_change >= 1"):
        EmotionRules(max_change=0)


# group 0: dialogue A (turn rewards 1, 3; emotion reward 0.8) and B (2; 0.4); group 1: C alone
TURNS = [[1.0, 3.0], [2.0], [0.0, 0.0, 3.0]]
EMOTION = [0.8, 0.4, 0.5]
GROUPS = [0, 0, 1]


def test_outcome_credit_gives_every_turn_its_dialogues_group_normalised_score():
    got = dialogue_advantages(TURNS, EMOTION, GROUPS, "outcome")
    # scores: A 2 + 0.8 = 2.8, B 2 + 0.4 = 2.4 -> +-1/sqrt(2); C alone keeps 1 + 0.5
    np.testing.assert_allclose(got[0], [R2, R2], atol=1e-5)
    np.testing.assert_allclose(got[1], [-R2], atol=1e-5)
    np.testing.assert_allclose(got[2], [1.5, 1.5, 1.5], atol=1e-5)   # (x - 0) / (1 + epsilon)


def test_turn_credit_compares_a_turn_with_the_groups_same_turn_and_adds_the_dialogues():
    got = dialogue_advantages(TURNS, EMOTION, GROUPS, "turn")
    # turn 0: A 1 vs B 2 -> -+1/sqrt(2); A's turn 1 has no peer -> 0;
    # emotion: A 0.8 vs B 0.4 -> +-1/sqrt(2); C alone: its turns 0, its emotion kept (0.5)
    np.testing.assert_allclose(got[0], [0.0, R2], atol=1e-5)
    np.testing.assert_allclose(got[1], [0.0], atol=1e-5)
    np.testing.assert_allclose(got[2], [0.5, 0.5, 0.5], atol=1e-5)   # (x - 0) / (1 + epsilon)
    weighted = dialogue_advantages(TURNS, EMOTION, GROUPS, "turn", turn_weight=2.0,
                                   dialogue_weight=0.5)
    np.testing.assert_allclose(weighted[0], [-2 * R2 + 0.5 * R2, 0.5 * R2], atol=1e-5)


def test_bad_dialogue_advantage_input_is_refused_naming_what_was_expected():
    with pytest.raises(ValueError, match=r"dialogue.credit='step': expected one of"):
        dialogue_advantages(TURNS, EMOTION, GROUPS, "step")
    with pytest.raises(ValueError, match="3 dialogues' turn rewards, 2 dialogue rewards"):
        dialogue_advantages(TURNS, EMOTION[:2], GROUPS)
    with pytest.raises(ValueError, match="a dialogue without a policy turn"):
        dialogue_advantages([[], [1.0]], [0.1, 0.2], [0, 0])


def test_peer_similarity_compares_a_reply_with_its_groups_others_whatever_their_number():
    from peer_rl.algos.rewards import peer_similarity

    # group 7: three replies at 0, 90 and 45 degrees; group 2: one reply alone
    e = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [3.0, 4.0]])
    c = 1 / np.sqrt(2)                                  # cos 45
    np.testing.assert_allclose(peer_similarity(e, [7, 7, 7, 2]),
                               [(0 + c) / 2, (0 + c) / 2, c, 0.0], atol=1e-6)
    np.testing.assert_allclose(peer_similarity(e, [7, 7, 7, 2], "max"), [c, c, c, 0.0],
                               atol=1e-6)
    # opposite replies clip at 0, as group_similarity's do
    np.testing.assert_allclose(peer_similarity(np.array([[1.0, 0], [-1.0, 0]]), [0, 0]), [0, 0])
