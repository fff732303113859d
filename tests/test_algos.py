import math

import pytest
import torch

from peer_rl.algos import (compute_grpo_outcome_advantage, compute_policy_loss, get_adv_estimator,
                           kl_penalty, masked_mean)


def test_grpo_advantage_hand_values():
    scores = torch.tensor([3.0, 1.0, 2.0, 2.0, 5.0, 5.0])
    index = torch.tensor([0, 0, 0, 0, 1, 2])
    adv = compute_grpo_outcome_advantage(scores, index, epsilon=0.0)
    # group 0: mean 2, unbiased std sqrt(2/3)
    s = math.sqrt(2 / 3)
    torch.testing.assert_close(adv[:4], torch.tensor([1 / s, -1 / s, 0.0, 0.0]))
    torch.testing.assert_close(adv[4:], torch.zeros(2))  # singleton groups -> 0


def test_grpo_advantage_equal_rewards_give_zero():
    adv = compute_grpo_outcome_advantage(torch.ones(4), torch.zeros(4, dtype=torch.long))
    assert torch.all(adv == 0)


def test_registry_names_the_known_estimators():
    assert get_adv_estimator("grpo") is compute_grpo_outcome_advantage
    with pytest.raises(KeyError, match="adv_estimator='gae'"):
        get_adv_estimator("gae")


def test_low_var_kl_k3_values():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.0])
    kl = kl_penalty(logp, ref, "low_var_kl")
    r = 1.0  # ref - logp for the second token
    torch.testing.assert_close(kl, torch.tensor([0.0, math.exp(r) - r - 1]))


def test_policy_loss_clipping():
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.5, 0.5]]))  # ratios 1.5 and 0.5
    mask = torch.ones(1, 2)
    adv = torch.ones(1, 1)
    loss, clip_frac, _ = compute_policy_loss(old, new, adv, mask, clip_ratio=0.2)
    # A>0: max(-1.5, -1.2) = -1.2 (clipped); max(-0.5, -0.8) = -0.5 (unclipped)
    assert loss.item() == pytest.approx((-1.2 - 0.5) / 2)
    assert clip_frac.item() == pytest.approx(0.5)


def test_behavior_weight_scales_each_token_of_the_clipped_surrogate():
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.5, 0.5]]))
    mask, adv = torch.ones(1, 2), torch.ones(1, 1)
    weight = torch.tensor([[2.0, 0.25]])
    loss, clip_frac, _ = compute_policy_loss(old, new, adv, mask, 0.2, behavior_weight=weight)
    # the clipped terms of the test above, -1.2 and -0.5, times 2 and 0.25
    assert loss.item() == pytest.approx((-1.2 * 2.0 - 0.5 * 0.25) / 2)
    assert clip_frac.item() == pytest.approx(0.5)          # clipping is decided before weighting
    new.requires_grad_(True)
    loss, _, _ = compute_policy_loss(old, new, adv, mask, 0.2, behavior_weight=weight)
    loss.backward()
    # d/dlogp of -A * r * w / 2 on the unclipped token: -r * w / 2 = -0.5 * 0.25 / 2; 0 if clipped
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, -0.0625]]))


def test_masked_mean_is_token_mean():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_mean(x, m).item() == pytest.approx(2.0)
