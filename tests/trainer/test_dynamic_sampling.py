"""Dynamic sampling's choices on hand-made scored batches: which groups have no signal, the
kept groups renumbered in order, batches joined, the step's metrics merged."""
import numpy as np
import pytest

from peer_rl.trainer.dynamic_sampling import (concat, group_values, merge_metrics, select_groups,
                                      zero_variance, zero_variance_metrics)
from peer_rl.protocol import Sample
from peer_rl.methods.scored_batch import ScoredBatch
from peer_rl.protocol import Similarities


class Parsed:
    def __init__(self, complete):
        self.complete = complete


def scored(rewards, final=None, complete=None, G=2, tag="x"):
    n = len(rewards)
    final = rewards if final is None else final
    complete = [True] * n if complete is None else complete
    samples = [Sample(uid=k // G, prompt_ids=[1], response_ids=[k], response_logprobs=[0.0],
                      text=f"{tag}{k}") for k in range(n)]
    return ScoredBatch(samples=samples, parsed=[Parsed(c) for c in complete],
                       replies=[f"{tag}{k}" for k in range(n)],
                       rewards=np.array(rewards, float), final=np.array(final, float),
                       redundancy=Similarities(s_hist=np.arange(n) / 10.0 + 1,
                                               s_group=np.arange(n) / 10.0 + 2,
                                               tau=np.arange(n) / 10.0,
                                               n_words=np.arange(n) + 3.0),
                       metrics={"judge/asked": n, "reward/format_rate": 1.0},
                       judge_raw=[[tag, k] for k in range(n)])


def test_group_values_per_metric_and_zero_variance():
    sb = scored([1.5, 1.5, 2.0, 3.0, 0.5, 0.5], final=[1.4, 1.5, 1.0, 1.0, 0.2, 0.2],
                complete=[True, True, False, True, False, False])
    np.testing.assert_array_equal(group_values(sb, "reward", 2), [[1.5, 1.5], [2.0, 3.0],
                                                                  [0.5, 0.5]])
    assert zero_variance(group_values(sb, "reward", 2)).tolist() == [True, False, True]
    assert zero_variance(group_values(sb, "final", 2)).tolist() == [False, True, True]
    assert zero_variance(group_values(sb, "format", 2)).tolist() == [True, False, True]
    with pytest.raises(ValueError, match="filter_groups.metric='acc'"):
        group_values(sb, "acc", 2)


def test_the_kept_groups_are_renumbered_in_order_with_their_samples():
    sb = scored([1.0, 2.0, 3.0, 3.0, 0.0, 1.0])
    rows = [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    new_rows, out = select_groups(rows, sb, [2, 0])
    assert [r["id"] for r in new_rows] == ["c", "a"]
    assert [s.uid for s in out.samples] == [0, 0, 1, 1]
    assert [s.text for s in out.samples] == ["x4", "x5", "x0", "x1"]
    assert out.replies == ["x4", "x5", "x0", "x1"] and out.judge_raw[0] == ["x", 4]
    np.testing.assert_array_equal(out.rewards, [0.0, 1.0, 1.0, 2.0])
    np.testing.assert_array_equal(out.redundancy.tau, [0.4, 0.5, 0.0, 0.1])
    # every field follows the same samples
    np.testing.assert_allclose(out.redundancy.s_hist, out.redundancy.tau + 1)
    np.testing.assert_allclose(out.redundancy.n_words, out.redundancy.tau * 10 + 3)
    assert [s.uid for s in sb.samples] == [0, 0, 1, 1, 2, 2]       # the input is untouched


def test_batches_join_with_uids_past_the_earlier_ones():
    a_rows, a = select_groups([{"id": 1}, {"id": 2}], scored([1.0, 2.0, 5.0, 5.0]), [0])
    b_rows, b = [{"id": 3}, {"id": 4}], scored([0.0, 1.0, 2.0, 0.0], tag="y")
    rows, out = concat([(a_rows, a), (b_rows, b)])
    assert [r["id"] for r in rows] == [1, 3, 4]
    assert [s.uid for s in out.samples] == [0, 0, 1, 1, 2, 2]
    assert [s.text for s in out.samples] == ["x0", "x1", "y0", "y1", "y2", "y3"]
    np.testing.assert_array_equal(out.final, [1.0, 2.0, 0.0, 1.0, 2.0, 0.0])
    assert len(out.redundancy.tau) == 6


def test_metrics_of_a_step_count_and_weigh_every_batch():
    a, b = scored([1.0, 2.0, 5.0, 5.0]), scored([0.0, 0.0], G=2)
    a.metrics["reward/format_rate"], b.metrics["reward/format_rate"] = 0.5, 1.0
    m = merge_metrics([a, b])
    assert m["judge/asked"] == 6                                # summed
    assert m["reward/format_rate"] == pytest.approx((0.5 * 4 + 1.0 * 2) / 6)
    z = zero_variance_metrics([a, b], 2)
    assert z["groups/zero_variance_share/reward"] == pytest.approx(2 / 3)
