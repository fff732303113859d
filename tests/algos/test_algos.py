"""GRPO's math against values worked out by hand: advantage estimators, the policy losses
(clip-higher, dual clip, GSPO) and the five loss aggregations, each with its micro-batch and
world-size invariance."""
import math

import numpy as np
import pytest
import torch

from peer_rl.algos import (ADV_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES, agg_loss,
                           compute_grpo_outcome_advantage, get_adv_estimator_fn,
                           get_policy_loss_fn, kl_penalty, masked_mean, sequence_advantages)
from peer_rl.algos.registry import BUILTIN_NAMES
from peer_rl.config.schema import ConfigError, load_config, registered_choices


def _outcome(scores, lengths):
    """verl's layout: the reward on each row's last response token."""
    T = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
    rewards = torch.zeros(len(scores), T)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        rewards[i, n - 1] = s
    return rewards, mask


# ---------------------------------------------------------------- advantage estimators
def test_grpo_hand_values_and_a_group_of_one_keeps_its_reward():
    rewards, mask = _outcome([3.0, 1.0, 2.0, 2.0, 5.0, 7.0], [1, 2, 3, 1, 2, 1])
    index = np.array(["a", "a", "a", "a", "b", "c"])
    adv, returns = compute_grpo_outcome_advantage(rewards, mask, index, epsilon=0.0)
    s = math.sqrt(2 / 3)                     # group a: mean 2, unbiased std sqrt(2/3)
    per_row = torch.tensor([1 / s, -1 / s, 0.0, 0.0, 5.0, 7.0])   # b, c: mean 0, std 1
    torch.testing.assert_close(adv, per_row[:, None] * mask)
    assert adv is returns or torch.equal(adv, returns)


def test_dr_grpo_leaves_out_the_std():
    rewards, mask = _outcome([3.0, 1.0, 2.0, 2.0], [1, 1, 1, 1])
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, np.zeros(4),
                                            norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_a_zero_variance_group_gets_zero_advantage_in_every_estimator():
    rewards, mask = _outcome([2.5] * 4, [2, 1, 3, 1])
    assert sorted(ADV_ESTIMATORS) == ["grpo", "reinforce_plus_plus_baseline", "rloo"]
    for name in ADV_ESTIMATORS:         # every registered one: a new estimator is held here too
        adv, _ = get_adv_estimator_fn(name)(rewards, mask, np.zeros(4))
        assert torch.all(adv == 0), name
    # a group with a spread is not all zero in any of them (the check above can fail)
    spread, _ = _outcome([2.5, 1.0, 2.5, 1.0], [2, 1, 3, 1])
    for name in ADV_ESTIMATORS:
        adv, _ = get_adv_estimator_fn(name)(spread, mask, np.zeros(4))
        assert torch.any(adv != 0), name


def test_rloo_is_the_reward_minus_the_others_mean():
    rewards, mask = _outcome([3.0, 1.0, 2.0, 2.0, 4.0], [1, 1, 1, 1, 1])
    adv, _ = get_adv_estimator_fn("rloo")(rewards, mask, np.array([0, 0, 0, 0, 1]))
    # 3 - (1+2+2)/3 = 4/3; 1 - 7/3 = -4/3; 2 - 2 = 0; a group of one keeps its reward
    torch.testing.assert_close(adv[:, 0], torch.tensor([4 / 3, -4 / 3, 0.0, 0.0, 4.0]))


def test_reinforce_plus_plus_baseline_whitens_over_tokens():
    # group 0: [3, 1] -> centred [1, -1], lengths 2 and 1; group 1: [5], alone -> 5, length 1
    rewards, mask = _outcome([3.0, 1.0, 5.0], [2, 1, 1])
    adv, _ = get_adv_estimator_fn("reinforce_plus_plus_baseline")(rewards, mask,
                                                                   np.array([0, 0, 1]))
    # token values 1, 1, -1, 5: mean 1.5, unbiased variance 19/4 * 4/3
    sd = math.sqrt(19 / 4 * 4 / 3)
    want = torch.tensor([[(1 - 1.5) / sd, (1 - 1.5) / sd], [(-1 - 1.5) / sd, 0.0],
                         [(5 - 1.5) / sd, 0.0]])
    torch.testing.assert_close(adv, want, atol=1e-6, rtol=0)


def test_sequence_advantages_are_the_estimators_value_per_row():
    scores = [3.0, 1.0, 2.0, 2.0]
    got = sequence_advantages("rloo", scores, np.zeros(4), [3, 1, 2, 1])
    np.testing.assert_allclose(got, [4 / 3, -4 / 3, 0.0, 0.0], atol=1e-6)
    got = sequence_advantages("grpo", scores, np.zeros(4), norm_adv_by_std_in_grpo=False)
    np.testing.assert_allclose(got, [1.0, -1.0, 0.0, 0.0], atol=1e-6)


def test_registries_and_the_config_choices_agree():
    assert set(ADV_ESTIMATORS) == {"grpo", "rloo", "reinforce_plus_plus_baseline"}
    assert set(POLICY_LOSSES) == {"vanilla", "gspo"}
    # the torch-free list the config reads names exactly what the modules register
    assert set(BUILTIN_NAMES["algorithm.adv_estimator"]) == set(ADV_ESTIMATORS)
    assert set(BUILTIN_NAMES["actor.policy_loss.loss_mode"]) == set(POLICY_LOSSES)
    choices = registered_choices()
    assert set(choices["algorithm.adv_estimator"]) == set(ADV_ESTIMATORS)
    assert set(choices["actor.policy_loss.loss_mode"]) == set(POLICY_LOSSES)
    assert set(choices["actor.loss_agg_mode"]) == set(LOSS_AGG_MODES)
    with pytest.raises(KeyError, match="adv_estimator='gae'"):
        get_adv_estimator_fn("gae")
    with pytest.raises(KeyError, match="loss_mode='sapo'"):
        get_policy_loss_fn("sapo")


def test_a_plugin_estimator_and_policy_loss_are_accepted_by_the_config(monkeypatch):
    """The config reads the registries when it is loaded, so what a plug-in registers first is
    a choice like verl's own (and not before it is registered)."""
    with pytest.raises(ConfigError, match="algorithm.adv_estimator='my_est'"):
        load_config(["algorithm.adv_estimator=my_est"])
    monkeypatch.setitem(ADV_ESTIMATORS, "my_est", lambda *a, **k: None)
    monkeypatch.setitem(POLICY_LOSSES, "my_loss", lambda *a, **k: None)
    cfg = load_config(["algorithm.adv_estimator=my_est", "actor.policy_loss.loss_mode=my_loss"])
    assert (cfg.algorithm.adv_estimator, cfg.actor.policy_loss.loss_mode) == ("my_est", "my_loss")


# ---------------------------------------------------------------- aggregation
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [0.5, 0.5, 0.5]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
# row sums 3, 4, -, 1.5 over 2, 1, 0, 3 tokens; row 2 has no token and counts in no mean
BY_HAND = {"token-mean": (3 + 4 + 1.5) / 6, "token-sum": 8.5,
           "seq-mean-token-sum": (3 + 4 + 1.5) / 3,
           "seq-mean-token-mean": (1.5 + 4 + 0.5) / 3,
           "seq-mean-token-sum-norm": (3 + 4 + 1.5) / 3 / 3}     # width 3


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_each_aggregation_on_a_ragged_mask(mode):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(BY_HAND[mode])


def test_the_norm_mode_divides_by_the_given_constant():
    got = agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=10)
    assert got.item() == pytest.approx((3 + 4 + 1.5) / 3 / 10)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_on_two_ranks_sum_to_the_one_batch_loss(mode):
    """Rank r holds rows r::2, one row per micro-batch, each cut to its own width; summed over
    micro-batches and averaged over ranks (what FSDP does to gradients) = the whole batch."""
    info = {"batch_num_tokens": MASK.sum(), "global_batch_size": (MASK.sum(1) > 0).sum(),
            "loss_scale_factor": 3}
    for ws in (1, 2):
        total = 0.0
        for rank in range(ws):
            for row in range(rank, len(LOSS), ws):
                width = max(int(MASK[row].sum()), 1)
                total += agg_loss(LOSS[row:row + 1, :width], MASK[row:row + 1, :width], mode,
                                  dp_size=ws, **info).item()
        assert total / ws == pytest.approx(BY_HAND[mode]), (mode, ws)


def test_a_world_size_without_global_counts_is_refused():
    with pytest.raises(ValueError, match="batch_num_tokens is required"):
        agg_loss(LOSS, MASK, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="loss_agg_mode='mean'"):
        agg_loss(LOSS, MASK, "mean")


# ---------------------------------------------------------------- policy losses
def _ratios(*r):
    return torch.zeros(1, len(r)), torch.log(torch.tensor([list(r)]))


def test_vanilla_symmetric_clip():
    old, new = _ratios(1.5, 0.5)
    loss, m = get_policy_loss_fn("vanilla")(old, new, torch.ones(1, 1), torch.ones(1, 2),
                                            "token-mean", {"clip_ratio": 0.2})
    # A > 0: max(-1.5, -1.2) = -1.2 (clipped); max(-0.5, -0.8) = -0.5 (unclipped)
    assert loss.item() == pytest.approx((-1.2 - 0.5) / 2)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5) and m["actor/pg_clipfrac_lower"] == 0


def test_clip_higher_lets_a_good_token_rise_further():
    old, new = _ratios(1.25)
    adv, mask = torch.ones(1, 1), torch.ones(1, 1)
    fn = get_policy_loss_fn("vanilla")
    sym, _ = fn(old, new, adv, mask, "token-mean", {"clip_ratio": 0.2})
    dapo, m = fn(old, new, adv, mask, "token-mean",
                 {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28})
    assert sym.item() == pytest.approx(-1.2)            # clipped at 1 + 0.2
    assert dapo.item() == pytest.approx(-1.25)          # 1.25 < 1 + 0.28: unclipped
    assert m["actor/pg_clipfrac"] == 0
    # the low side is still 1 - 0.2: a ratio of 0.7 with A < 0 is clipped to 0.8
    old, new = _ratios(0.7)
    low, _ = fn(old, new, -adv, mask, "token-mean",
                {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28})
    assert low.item() == pytest.approx(0.8)             # max(0.7, 0.8)


def test_dual_clip_caps_a_bad_tokens_loss_and_its_gradient():
    old, new = _ratios(5.0, 2.0)
    new.requires_grad_(True)
    loss, m = get_policy_loss_fn("vanilla")(old, new, -torch.ones(1, 1), torch.ones(1, 2),
                                            "token-mean", {"clip_ratio": 0.2, "clip_ratio_c": 3.0})
    # A = -1: token 1: max(5, 1.2) = 5, capped at 3; token 2: max(2, 1.2) = 2 < 3, kept
    assert loss.item() == pytest.approx((3.0 + 2.0) / 2)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(0.5)
    loss.backward()
    # d/dlogp of -A * ratio / 2 = ratio / 2 on the kept token; the capped one gets none
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, 1.0]]))


def test_a_dual_clip_bound_at_or_below_one_is_refused():
    old, new = _ratios(1.0)
    with pytest.raises(ValueError, match="clip_ratio_c=1.0"):
        get_policy_loss_fn("vanilla")(old, new, torch.ones(1, 1), torch.ones(1, 1),
                                      "token-mean", {"clip_ratio_c": 1.0})


def test_rollout_weights_scale_each_tokens_loss_after_clipping():
    old, new = _ratios(1.5, 0.5)
    weight = torch.tensor([[2.0, 0.25]])
    loss, m = get_policy_loss_fn("vanilla")(old, new, torch.ones(1, 1), torch.ones(1, 2),
                                            "token-mean", {"clip_ratio": 0.2}, weight)
    assert loss.item() == pytest.approx((-1.2 * 2.0 - 0.5 * 0.25) / 2)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_gspo_takes_one_ratio_per_sequence():
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.2, -0.1, 9.0], [math.log(1.5)] * 3]).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])    # row 0's third token is padding
    loss, m = get_policy_loss_fn("gspo")(old, new, torch.ones(2, 1), mask,
                                         "seq-mean-token-mean", {"clip_ratio": 0.2})
    s0 = math.exp((0.2 - 0.1) / 2)                         # geometric mean of row 0's ratios
    # row 0 unclipped: -s0 on each token; row 1: ratio 1.5 clipped to 1.2
    assert loss.item() == pytest.approx((-s0 - 1.2) / 2)
    assert m["actor/pg_clipfrac"] == pytest.approx(3 / 5)
    loss.backward()
    # each of row 0's tokens: d(-s0 * pi/sg[pi]) / dlogp = -s0, / 2 tokens / 2 sequences
    torch.testing.assert_close(new.grad, torch.tensor([[-s0 / 4, -s0 / 4, 0.0], [0.0] * 3]))


def test_low_var_kl_k3_values():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.0])
    kl = kl_penalty(logp, ref, "low_var_kl")
    r = 1.0  # ref - logp for the second token
    torch.testing.assert_close(kl, torch.tensor([0.0, math.exp(r) - r - 1]))


def test_masked_mean_is_token_mean():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_mean(x, m).item() == pytest.approx(2.0)
