"""A dialogue's turns as trained rows (peer_rl.methods.dialogue_turns), on hand-built dialogues:
row order, groups, what the judge and RUR are given, and the metrics, worked out by hand."""
import numpy as np
import pytest

from peer_rl.algos.rewards import (count_words, history_similarity, length_coefficient,
                                  peer_similarity, rur_reweight)
from peer_rl.methods.dialogue_rollout import Dialogue, PolicyTurn, SeekerProfile
from peer_rl.methods.dialogue_turns import (dialogue_metrics, per_dialogue, turn_histories,
                                            turn_judge_items, turn_peers, turn_samples, turns)
from peer_rl.prompts.judge import JudgeTemplate
from peer_rl.prompts.judge_rounds import judge_result
from peer_rl.prompts.reasoning import parse_structured
from peer_rl.protocol import Sample
from peer_rl.config.worker_settings import RewardWeights

PROFILE = SeekerProfile("p", "You are Ann.", "I lost my job.", "en")


def turn(reply: str, history: list[dict], steps: bool = True) -> PolicyTurn:
    text = (f"Step 1: lost job\nStep 2: sad\nStep 3: reflect\nStep 4: {reply}" if steps
            else reply)
    return PolicyTurn(history, Sample(uid=-1, prompt_ids=[1], response_ids=[2],
                                      response_logprobs=[-1.0], text=text),
                      parse_structured(text))


OPEN = [{"role": "seeker", "content": "I lost my job."}]
# group 0: dialogue A (2 turns, ended at the limit), B (1 turn, goodbye); group 1: C (1 turn)
A = Dialogue(0, PROFILE, [turn("That hurts.", OPEN),
                          turn("Tell me more.", OPEN + [{"role": "supporter", "content": "That hurts."},
                                                        {"role": "seeker", "content": "Yes."}])],
             trajectory=[40, 46, 50], end="max_turns")
B = Dialogue(0, PROFILE, [turn("Cheer up!", OPEN, steps=False)], trajectory=[40, 32],
             end="goodbye")
C = Dialogue(1, PROFILE, [turn("I hear you.", OPEN)], trajectory=[40, 50], end="max_turns")
DIALOGUES = [A, B, C]


def test_rows_are_each_dialogues_turns_in_order_with_its_group():
    assert turns(DIALOGUES) == [(0, 0), (0, 1), (1, 0), (2, 0)]
    assert [s.uid for s in turn_samples(DIALOGUES)] == [0, 0, 0, 1]
    split = per_dialogue(DIALOGUES, [1.0, 2.0, 3.0, 4.0])
    assert [x.tolist() for x in split] == [[1.0, 2.0], [3.0], [4.0]]


def test_rur_sees_the_dialogues_own_earlier_replies_and_the_groups_same_turn():
    assert turn_histories(DIALOGUES) == [[], ["That hurts."], [], []]
    # (group 0, turn 0) holds A's and B's first turns; A's second turn and C's are alone
    assert turn_peers(DIALOGUES).tolist() == [0, 1, 0, 2]


def test_a_turn_is_judged_on_its_steps_against_the_dialogue_so_far_without_an_outcome_round():
    items = turn_judge_items(DIALOGUES)
    assert items[1].history == A.turns[1].history and items[1].reply == "Tell me more."
    assert items[1].steps == ["lost job", "sad", "reflect"] and items[1].reference is None
    assert items[2].steps == [None, None, None] and not items[2].format_complete
    template = JudgeTemplate()
    slots = template.item_turns(items[0], items[0].history)
    assert [s is not None for s in slots] == [True, True, True, False]
    assert template.item_turns(items[2], items[2].history) == [None] * 4
    # three sound steps and the format: 0.5 x 3 + 1 = 2.5, no preference asked or counted
    result = judge_result(items[0], ["True", "True", "True", None], RewardWeights())
    assert result.reward == pytest.approx(2.5) and result.preference_ok is None
    assert result.asked == 3 and result.parse_failures == 0


def test_the_steps_metrics_are_the_dialogues_turns_emotions_ends_and_turn_rewards():
    m = dialogue_metrics(DIALOGUES, [1.0, 2.0, 3.0, 4.0])
    assert m["dialogue/turns_mean"] == pytest.approx(4 / 3)
    assert m["dialogue/emotion_start"] == 40
    assert m["dialogue/emotion_end"] == pytest.approx((50 + 32 + 50) / 3)
    assert m["dialogue/emotion_mean"] == pytest.approx((np.mean([40, 46, 50]) + 36 + 45) / 3)
    assert m["dialogue/end_max_turns"] == pytest.approx(2 / 3)
    assert m["dialogue/end_goodbye"] == pytest.approx(1 / 3)
    assert m["dialogue/end_success"] == 0 and m["dialogue/end_failure"] == 0
    assert m["dialogue/turn1_reward"] == pytest.approx((1 + 3 + 4) / 3)
    assert m["dialogue/turn2_reward"] == pytest.approx(2.0)


# replies as unit vectors (an encoder's output, chosen by hand): cos(A1, B1) = 0.8,
# cos(A2, A1) = 0.6, C1 orthogonal to all
EMBED = {"That hurts.": [1.0, 0.0, 0.0], "Tell me more.": [0.6, 0.8, 0.0],
         "Cheer up!": [0.8, 0.6, 0.0], "I hear you.": [0.0, 0.0, 1.0]}


def test_a_turns_reward_and_its_rur_factors_on_a_hand_built_dialogue():
    items = turn_judge_items(DIALOGUES)
    verdicts = [["True"] * 3 + [None], ["True", "False", "True", None], [None] * 4,
                ["True"] * 3 + [None]]
    rewards = [judge_result(i, v, RewardWeights()).reward for i, v in zip(items, verdicts)]
    # 3 sound steps + format; 2 + format; no steps, no format; 3 + format
    assert rewards == pytest.approx([2.5, 2.0, 0.0, 2.5])
    replies = [i.reply for i in items]
    hist = turn_histories(DIALOGUES)
    owner = np.repeat(np.arange(len(hist)), [len(h) for h in hist])
    s_hist = history_similarity(np.array([EMBED[r] for r in replies]),
                                np.array([EMBED[u] for h in hist for u in h]).reshape(-1, 3),
                                owner, np.arange(len(replies)))
    s_in = peer_similarity(np.array([EMBED[r] for r in replies]), turn_peers(DIALOGUES))
    assert s_hist == pytest.approx([0.0, 0.6, 0.0, 0.0])
    assert s_in == pytest.approx([0.8, 0.0, 0.8, 0.0])
    # tau = sigmoid(0.5 (words - 5)): 2 words 0.182426, 3 words 0.268941 ("I hear you.")
    tau = length_coefficient([count_words(r, 1.0) for r in replies])
    assert tau == pytest.approx([0.182426, 0.268941, 0.182426, 0.268941], abs=1e-6)
    reweighted = rur_reweight(rewards, s_hist, s_in, tau)
    # A1: 2.5 / (1 + 0.182426 x 0.8); A2: 2.0 / (1 + 0.268941 x 0.6); B1: 0; C1 alone: 2.5
    assert reweighted == pytest.approx([2.181614, 1.722111, 0.0, 2.5], abs=1e-5)
