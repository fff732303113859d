"""Dynamic sampling's choices on hand-made scored batches: which groups have no signal, the
kept groups renumbered in order, batches joined, the step's metrics merged, and a step's refills
against verl's behaviour at the draw limit."""
import numpy as np
import pytest

from peer_rl.config.schema import ConfigError, FilterGroupsConfig, load_config
from peer_rl.trainer.dynamic_sampling import (DynamicSamplingLimit, concat, group_values,
                                              merge_metrics, refill, select_groups,
                                              zero_variance, zero_variance_metrics)
from peer_rl.protocol import Sample
from peer_rl.methods.scored_batch import ScoredBatch
from peer_rl.protocol import Similarities


class Parsed:
    def __init__(self, complete):
        self.complete = complete


def scored(rewards, reweighted=None, complete=None, G=2, tag="x"):
    n = len(rewards)
    reweighted = rewards if reweighted is None else reweighted
    complete = [True] * n if complete is None else complete
    samples = [Sample(uid=k // G, prompt_ids=[1], response_ids=[k], response_logprobs=[0.0],
                      text=f"{tag}{k}") for k in range(n)]
    return ScoredBatch(samples=samples, parsed=[Parsed(c) for c in complete],
                       replies=[f"{tag}{k}" for k in range(n)],
                       rewards=np.array(rewards, float), reweighted=np.array(reweighted, float),
                       redundancy=Similarities(s_hist=np.arange(n) / 10.0 + 1,
                                               s_group=np.arange(n) / 10.0 + 2,
                                               tau=np.arange(n) / 10.0,
                                               n_words=np.arange(n) + 3.0),
                       metrics={"judge/asked": n, "reward/format_rate": 1.0},
                       judge_raw=[[tag, k] for k in range(n)])


def test_group_values_per_metric_and_zero_variance():
    sb = scored([1.5, 1.5, 2.0, 3.0, 0.5, 0.5], reweighted=[1.4, 1.5, 1.0, 1.0, 0.2, 0.2],
                complete=[True, True, False, True, False, False])
    np.testing.assert_array_equal(group_values(sb, "reward"), [[1.5, 1.5], [2.0, 3.0],
                                                                  [0.5, 0.5]])
    assert zero_variance(group_values(sb, "reward")).tolist() == [True, False, True]
    assert zero_variance(group_values(sb, "reweighted")).tolist() == [False, True, True]
    assert zero_variance(group_values(sb, "format")).tolist() == [True, False, True]
    with pytest.raises(ValueError, match="filter_groups.metric='acc'"):
        group_values(sb, "acc")


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
    np.testing.assert_array_equal(out.reweighted, [1.0, 2.0, 0.0, 1.0, 2.0, 0.0])
    assert len(out.redundancy.tau) == 6


def test_metrics_of_a_step_count_and_weigh_every_batch():
    a, b = scored([1.0, 2.0, 5.0, 5.0]), scored([0.0, 0.0], G=2)
    a.metrics["reward/format_rate"], b.metrics["reward/format_rate"] = 0.5, 1.0
    m = merge_metrics([a, b])
    assert m["judge/asked"] == 6                                # summed
    assert m["reward/format_rate"] == pytest.approx((0.5 * 4 + 1.0 * 2) / 6)
    z = zero_variance_metrics([a, b])
    assert z["groups/zero_variance_share/reward"] == pytest.approx(2 / 3)


def test_the_reweighted_share_counts_ties_after_rur_not_of_the_rewards():
    """Two drawn batches of groups of 2: rewards tie in 3 of 4 groups; after RUR's reweighting
    (reweighted) a tied reward of 1 splits (0.5 vs 0.7) and a tied 0 stays tied: 2 of 4."""
    a = scored([1.0, 1.0, 5.0, 5.0], reweighted=[0.5, 0.7, 2.0, 2.0])
    b = scored([0.0, 0.0, 1.0, 3.0], reweighted=[0.0, 0.0, 0.4, 1.5])
    z = zero_variance_metrics([a, b])
    assert z["groups/zero_variance_share/reward"] == pytest.approx(3 / 4)
    assert z["groups/zero_variance_share/reweighted"] == pytest.approx(2 / 4)


def _draws(*batches):
    """`refill`'s draw(): the given (rows, scored) batches in order, counted."""
    it = iter(batches)
    calls = []

    def draw():
        calls.append(1)
        return next(it)
    return draw, calls


def _batch(tag, rewards, reweighted=None):
    return [{"id": f"{tag}{g}"} for g in range(len(rewards) // 2)], scored(rewards, reweighted,
                                                                            tag=tag)


def test_the_draw_limit_defaults_to_none_and_at_the_limit_the_run_stops_as_in_verls_dapo():
    # verl 0.9.1 (trainer/config/algorithm.py, ppo_trainer.yaml): max_num_gen_batches 0, no
    # limit; its DAPO recipe raises when the limit is reached with the batch short
    fg = load_config(["algorithm.filter_groups.enable=true"]).algorithm.filter_groups
    assert (fg.max_num_gen_batches, fg.on_limit) == (0, "raise")
    assert FilterGroupsConfig().max_num_gen_batches == 0
    with pytest.raises(ConfigError, match="config key 'algorithm.filter_groups.on_limit': "
                                          "Invalid value 'keep', expected one of"):
        load_config(["algorithm.filter_groups.on_limit=keep"])


def test_the_metrics_old_name_final_still_reads_as_reweighted_in_recipes_and_overrides(tmp_path):
    """`final` was the advantages' input's name until issue 59: a recipe or a command line that
    says it keeps working, and means `reweighted`."""
    recipe = tmp_path / "old.yaml"
    recipe.write_text("base: tiny\nalgorithm:\n  filter_groups:\n    metric: final\n")
    assert load_config([f"recipe={recipe}"]).algorithm.filter_groups.metric == "reweighted"
    old = load_config(["algorithm.filter_groups.metric=final"]).algorithm.filter_groups
    assert old.metric == "reweighted"
    assert load_config([]).algorithm.filter_groups.metric == "reweighted"      # the default
    with pytest.raises(ConfigError, match=r"'algorithm.filter_groups.metric': Invalid value 'finale', "
                                          r"expected one of \['reweighted', 'reward', 'format'\]"):
        load_config(["algorithm.filter_groups.metric=finale"])


def test_without_a_limit_batches_are_drawn_until_the_batch_is_full():
    tied = [_batch(f"t{i}", [1.0, 1.0, 2.0, 2.0]) for i in range(6)]
    draw, calls = _draws(*tied[1:], _batch("v", [0.0, 1.0, 3.0, 2.0]))
    rows, out, note = refill(tied[0], draw, FilterGroupsConfig(enable=True), 2, step=1)
    assert len(calls) == 6 and note is None
    assert [r["id"] for r in rows] == ["v0", "v1"]
    assert out.metrics["filter/gen_batches"] == 7 and out.metrics["filter/short"] == 0.0


def test_at_the_limit_a_short_batch_raises_unless_on_limit_says_train_short():
    first = _batch("a", [1.0, 2.0, 3.0, 3.0])            # one group of two varies
    second = _batch("b", [0.0, 0.0, 1.0, 1.0])           # none does
    fg = FilterGroupsConfig(enable=True, max_num_gen_batches=2)
    with pytest.raises(DynamicSamplingLimit,
                       match=r"step 4: dynamic sampling kept 1 of 2 group\(s\) whose reweighted "
                       r"varies after 2 batch\(es\) "
                       r"\(algorithm.filter_groups.max_num_gen_batches=2\); "
                       r"algorithm.filter_groups.on_limit=raise"):
        refill(first, _draws(second)[0], fg, 2, step=4)
    fg.on_limit = "train_short"
    rows, out, note = refill(first, _draws(second)[0], fg, 2, step=4)
    assert [r["id"] for r in rows] == ["a0"] and note.endswith("training on those 1")
    assert out.metrics["filter/short"] == 1.0 and out.metrics["filter/kept_groups"] == 1


def _grpo_advantages(reweighted, G=2):
    """GRPO's (r - mean) / (std + eps) per group, unbiased std, by hand."""
    out = []
    for g in range(0, len(reweighted), G):
        x = np.array(reweighted[g:g + G], float)
        out += list((x - x.mean()) / (x.std(ddof=1) + 1e-6))
    return np.array(out)


def test_the_line_for_a_batch_with_no_signal_says_what_its_advantages_are():
    fg = FilterGroupsConfig(enable=True, metric="reward", max_num_gen_batches=1,
                            on_limit="train_short")
    # every group ties on the judge's reward, but RUR's reweighted varies in the first group
    rewards, reweighted = [2.0, 2.0, 1.0, 1.0], [1.5, 1.2, 0.8, 0.8]
    _, out, note = refill(_batch("r", rewards, reweighted), None, fg, 2, step=1)
    assert np.abs(_grpo_advantages(out.reweighted)).max() > 0.5       # not all 0
    assert "advantages are all 0" not in note and "all 0" not in note
    assert ("reweighted (what the advantages are computed from) varies in 1 of its 2 group(s)"
            in note)
    fg.metric = "reweighted"
    _, out, note = refill(_batch("f", rewards, [1.0, 1.0, 0.8, 0.8]), None, fg, 2, step=1)
    assert np.abs(_grpo_advantages(out.reweighted)).max() == 0.0
    assert note.endswith("training on the first batch, whose advantages are all 0")
    fg.metric = "reward"
    _, _, note = refill(_batch("g", rewards, [1.0, 1.0, 0.8, 0.8]), None, fg, 2, step=1)
    assert note.endswith("whose reward and reweighted both tie in every group: advantages all 0")


def dialogue_batch(turns: list[int], advantages: list[float], uids: list[int], tag: str):
    """Whole conversations: dialogue k has turns[k] turns and group uids[k]; a row per turn,
    dialogue by dialogue, carrying the method's advantages."""
    from peer_rl.methods.dialogue_rollout import Dialogue, PolicyTurn, SeekerProfile

    profile = SeekerProfile("p", "You are Ann.", "Hi.", "en")
    dialogues, samples = [], []
    for k, (n, uid) in enumerate(zip(turns, uids)):
        d = Dialogue(uid, profile, trajectory=[40] * (n + 1), end="max_turns")
        for t in range(n):
            sample = Sample(uid=uid, prompt_ids=[1], response_ids=[t], response_logprobs=[0.0],
                            text=f"{tag}{k}.{t}")
            d.turns.append(PolicyTurn([], sample, Parsed(True)))
            samples.append(sample)
        dialogues.append(d)
    n = len(samples)
    return ScoredBatch(samples=samples, parsed=[Parsed(True)] * n,
                       replies=[s.text for s in samples], rewards=np.ones(n),
                       reweighted=np.ones(n), redundancy=None, metrics={"judge/asked": n},
                       judge_raw=[None] * n, advantages=np.array(advantages, float),
                       dialogues=dialogues)


def test_dialogue_groups_tie_on_their_advantages_and_keep_their_dialogues():
    # group 0: dialogues of 2 and 1 turns, advantages all 0 (tied); group 1: 1 and 2 turns
    sb = dialogue_batch([2, 1, 1, 2], [0, 0, 0, 0.5, -0.5, -0.5], [0, 0, 1, 1], "a")
    values = group_values(sb, "reweighted")
    assert [v.tolist() for v in values] == [[0, 0, 0], [0.5, -0.5, -0.5]]
    assert zero_variance(values).tolist() == [True, False]
    assert zero_variance(group_values(sb, "reward")).tolist() == [True, True]
    # every step logs these, filtering or not: groups of 3 rows each here, of 2 + 1 turns
    assert zero_variance_metrics([sb]) == {"groups/zero_variance_share/reward": 1.0,
                                              "groups/zero_variance_share/reweighted": 0.5}
    ragged = dialogue_batch([2, 1, 1, 1], [0.5, 0.5, -1.0, 0, 0], [0, 0, 1, 1], "r")
    assert [len(v) for v in group_values(ragged, "reweighted")] == [3, 2]
    assert zero_variance_metrics([ragged])["groups/zero_variance_share/reweighted"] == 0.5
    rows, out = select_groups([{"id": "x"}, {"id": "y"}], sb, [1])
    assert rows == [{"id": "y"}] and [s.text for s in out.samples] == ["a2.0", "a3.0", "a3.1"]
    assert out.advantages.tolist() == [0.5, -0.5, -0.5]
    assert [(d.uid, len(d.turns)) for d in out.dialogues] == [(0, 1), (0, 2)]
    assert [d.uid for d in sb.dialogues] == [0, 0, 1, 1]            # the input is untouched


def test_a_refilled_dialogue_batch_joins_the_kept_groups_dialogues_and_advantages():
    first = ([{"id": "x"}, {"id": "y"}],
             dialogue_batch([1, 1, 1, 1], [0, 0, 1, -1], [0, 0, 1, 1], "a"))
    more = ([{"id": "z"}, {"id": "w"}],
            dialogue_batch([2, 1, 1, 1], [1, -1, 1, 0, 0], [0, 0, 1, 1], "b"))
    rows, out, note = refill(first, lambda: more, FilterGroupsConfig(enable=True), 2, step=1)
    assert note is None and [r["id"] for r in rows] == ["y", "z"]
    assert [s.text for s in out.samples] == ["a2.0", "a3.0", "b0.0", "b0.1", "b1.0"]
    assert [s.uid for s in out.samples] == [0, 0, 1, 1, 1]
    assert out.advantages.tolist() == [1, -1, 1, -1, 1]
    assert [(d.uid, [t.sample.text for t in d.turns]) for d in out.dialogues] == \
        [(0, ["a2.0"]), (0, ["a3.0"]), (1, ["b0.0", "b0.1"]), (1, ["b1.0"])]
    assert out.metrics["filter/gen_batches"] == 2 and out.metrics["filter/kept_groups"] == 2
