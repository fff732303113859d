import math

import numpy as np
import pytest

from peer_rl.algos.rewards import count_words, group_similarity, history_similarity, length_coefficient, peer_reward, rur_reweight

from peer_rl.config.worker_settings import RewardWeights
from peer_rl.prompts.verdicts import Preference, candidate_preference_ok, parse_preference, parse_step_verdict


def test_peer_reward_hand_values():
    w = RewardWeights()      # 0.5 a sound step, 0.5 the preference, 1 the format
    assert peer_reward([True, True, True], True, True, w) == 3.0
    assert peer_reward([True, False, None], False, True, w) == 1.5
    assert peer_reward([None, None, None], None, False, w) == 0.0
    assert peer_reward([True, True, False], True, False, w) == 1.5


def test_peer_reward_with_other_weights():
    """Each weight multiplies its own term only: 0.25, 2 and 0.75 are chosen so that no sum of
    two mix-ups gives the same total."""
    w = RewardWeights(step=0.25, preference=2.0, format=0.75)
    # two sound steps (None is not sound) + preference + format: 0.5 + 2 + 0.75
    assert peer_reward([True, None, True], True, True, w) == 3.25
    # one sound step, the reference preferred, no format: 0.25
    assert peer_reward([False, True, False], False, False, w) == 0.25
    # the format alone
    assert peer_reward([None, None, None], None, True, w) == 0.75
    # a zero weight drops its term: three steps and the preference, format weight 0
    assert peer_reward([True, True, True], True, True, RewardWeights(format=0.0)) == 2.0


@pytest.mark.parametrize("text,expected", [
    ("True", True), ("False", False), ("true.", True), ("**False**", False),
    ("The step is True.", True), ("正确", True), ("错误", False), ("不正确", False),
    ("答案：正确。", True), ("TRUE", True), ("", None), ("maybe", None),
    ("True or False", None), ("truely", None),
])
def test_parse_step_verdict(text, expected):
    assert parse_step_verdict(text) is expected


@pytest.mark.parametrize("text,expected", [
    ("The first sentence is better", Preference.FIRST),
    ("the second sentence is better.", Preference.SECOND),
    ("I think the first sentence is better!", Preference.FIRST),
    ("The two sentences are almost good", Preference.TIE),
    ("Neither sentence is available", Preference.NEITHER),
    ("第一句更好", Preference.FIRST), ("第二句更好。", Preference.SECOND),
    ("差不多", Preference.TIE), ("都不可用", Preference.NEITHER),
    ("THE SECOND SENTENCE IS BETTER", Preference.SECOND),
    ("better", None), ("", None), ("The first sentence is better; the second sentence is better", None),
])
def test_parse_preference(text, expected):
    assert parse_preference(text) is expected


def test_candidate_preference_mapping_cancels_position():
    # candidate shown first: FIRST means candidate wins
    assert candidate_preference_ok(Preference.FIRST, candidate_first=True) is True
    assert candidate_preference_ok(Preference.FIRST, candidate_first=False) is False
    assert candidate_preference_ok(Preference.SECOND, candidate_first=False) is True
    assert candidate_preference_ok(Preference.TIE, candidate_first=False) is True
    assert candidate_preference_ok(Preference.NEITHER, candidate_first=True) is False
    assert candidate_preference_ok(None, candidate_first=True) is None


def test_length_coefficient_hand_values():
    assert length_coefficient(5) == pytest.approx(0.5)
    assert length_coefficient(2) == pytest.approx(1 / (1 + math.exp(1.5)))  # ~0.18
    assert length_coefficient(20) == pytest.approx(1 / (1 + math.exp(-7.5)))  # ~1
    np.testing.assert_allclose(length_coefficient([5, 5]), [0.5, 0.5])


def test_count_words_in_english_word_equivalents():
    assert count_words("hello there") == 2
    assert count_words("我很难过") == pytest.approx(4 / 1.5)      # 我 / 很 / 难过: ~3 words
    assert count_words("我很难过", cjk_chars_per_word=1.0) == 4
    assert count_words("I feel 很难过 today!") == pytest.approx(3 + 3 / 1.5)
    assert count_words("  ... ") == 0


def test_a_short_chinese_reply_is_penalised_like_a_short_english_one():
    # "It sounds like you're under a lot of pressure." (9 words) vs its 12-character zh form
    en = length_coefficient(count_words("It sounds like you're under a lot of pressure."))
    zh = length_coefficient(count_words("听起来你现在压力真的很大。"))
    assert count_words("听起来你现在压力真的很大。") == pytest.approx(12 / 1.5)
    assert abs(en - zh) < 0.1          # 0.881 vs 0.818; one CJK char per word would give 0.971


def test_rur_two_words_vs_twenty_words_at_equal_similarity():
    s_hist, s_group, r = 0.8, 0.6, 3.0
    tau2, tau20 = length_coefficient(2), length_coefficient(20)
    short, long = rur_reweight([r, r], [s_hist] * 2, [s_group] * 2, [tau2, tau20])
    assert short == pytest.approx(3.0 / ((1 + 0.18242552 * 0.8) * (1 + 0.18242552 * 0.6)), rel=1e-6)
    assert long == pytest.approx(3.0 / (1.8 * 1.6), rel=1e-3)  # tau ~ 1: 3 / 2.88
    assert short > 2.3 and long < 1.05


def test_rur_clips_similarities_and_is_identity_at_zero():
    np.testing.assert_allclose(rur_reweight([2.0], [0.0], [0.0], [1.0]), [2.0])
    np.testing.assert_allclose(rur_reweight([2.0], [1.7], [-0.3], [1.0]), [1.0])  # s clipped to 1, 0


def test_rur_on_a_negative_reward_never_favours_the_more_redundant_reply():
    """A Bradley-Terry score can be negative (ESCRAG-R1's reward model): r = -2 with
    tau = 1 and P = (1 + s_hist)(1 + s_group), worked out by hand. Dividing would give
    -2 / 1.0 = -2.0, -2 / 1.5 = -1.333, -2 / 3.0 = -0.667: the redundant reply best."""
    out = rur_reweight([-2.0, -2.0, -2.0], [0.0, 0.5, 1.0], [0.0, 0.0, 0.5], [1.0, 1.0, 1.0])
    np.testing.assert_allclose(out, [-2.0, -3.0, -6.0])           # -2 x 1, -2 x 1.5, -2 x 3
    # positive rewards keep the paper's r / P, and 0 stays 0
    np.testing.assert_allclose(rur_reweight([2.0, 2.0, 0.0], [0.5, 1.0, 1.0], [0.0, 0.5, 1.0],
                                            [1.0, 1.0, 1.0]), [2 / 1.5, 2 / 3.0, 0.0])
    # for any fixed reward, more redundancy (either similarity, or tau) never scores higher
    grid = np.linspace(0.0, 1.0, 11)
    for r in (-3.0, -0.25, 0.0, 0.5, 3.0):
        for tau in (0.1, 1.0):
            sh, sg = np.meshgrid(grid, grid, indexing="ij")
            v = rur_reweight(np.full(sh.size, r), sh.ravel(), sg.ravel(),
                             np.full(sh.size, tau)).reshape(sh.shape)
            assert (np.diff(v, axis=0) <= 1e-12).all() and (np.diff(v, axis=1) <= 1e-12).all()


def test_group_similarity_hand_computed():
    e = np.array([[1, 0], [1, 0], [0, 1], [1, 1]], dtype=np.float32)  # one group of 4
    c = 1 / math.sqrt(2)
    expected = [(1 + 0 + c) / 3, (1 + 0 + c) / 3, (0 + 0 + c) / 3, (c + c + c) / 3]
    np.testing.assert_allclose(group_similarity(e, 4), expected, rtol=1e-6)


def test_history_similarity_only_looks_at_own_prompt():
    replies = np.array([[1, 0], [0, 1]], dtype=np.float32)
    history = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float32)
    # prompt 0 owns history rows 0 and 2; prompt 1 owns row 1 ... but reply 1 belongs to prompt 0
    got = history_similarity(replies, history, np.array([0, 1, 0]), np.array([0, 0]))
    np.testing.assert_allclose(got, [1.0, 1 / math.sqrt(2)], rtol=1e-6)
    got = history_similarity(replies, history, np.array([0, 1, 0]), np.array([1, 7]))
    np.testing.assert_allclose(got, [0.0, 0.0])  # orthogonal; and no history at all
