"""Outcome advantage estimators, with verl's names and call shapes.

Each takes verl's arguments, `(token_level_rewards, response_mask, index, epsilon, ..., config)`
with (N, T) token tensors and the prompt id per row, and returns `(advantages, returns)`, both
(N, T), so that verl 0.9.1's function of the same name gives the same numbers on the same
tensors. Outcome rewards sit on one token per row, so every estimator here gives each row one
value on all its response tokens; `sequence_advantages` is the controller's door: one reward and
one length per sample in, one advantage per sample out.

Groups of one, as in verl: GRPO and RLOO leave the reward as it is (no baseline to subtract),
REINFORCE++-baseline subtracts nothing before its batch whitening.
"""
from __future__ import annotations

import numpy as np
import torch

from peer_rl.algos.registry import make_registry

ADV_ESTIMATORS, register_adv_est, get_adv_estimator_fn = make_registry("algorithm.adv_estimator")


def _groups(index) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's group number and each group's size, for any index verl passes (a numpy array
    of uid strings, a tensor, a list)."""
    if isinstance(index, torch.Tensor):
        index = index.cpu().numpy()
    _, inv = np.unique(np.asarray(index), return_inverse=True)
    inv = torch.as_tensor(inv.reshape(-1), dtype=torch.long)
    return inv, torch.bincount(inv).to(torch.float64)


def _group_sum(values: torch.Tensor, inv: torch.Tensor, k: int) -> torch.Tensor:
    return torch.zeros(k, dtype=torch.float64).scatter_add_(0, inv, values)


def _masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl_F.masked_whiten: mean and unbiased variance over the masked tokens."""
    mask = mask.to(values.dtype)
    n = mask.sum()
    if n < 2:
        raise ValueError("whitening needs at least two response tokens in the batch")
    mean = (values * mask).sum() / (n + 1e-8)
    var = (((values - mean) ** 2) * mask).sum() / (n + 1e-8) * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


@register_adv_est("grpo")
def compute_grpo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                   index, epsilon: float = 1e-6,
                                   norm_adv_by_std_in_grpo: bool = True, config=None):
    """(r_i - mean_g) / (std_g + eps), std unbiased as torch.std; without the std (Dr. GRPO)
    r_i - mean_g. A group of one keeps its reward (mean 0, std 1, as verl)."""
    scores = token_level_rewards.sum(dim=-1).to(torch.float64)
    inv, count = _groups(index)
    mean = _group_sum(scores, inv, len(count)) / count
    centred = scores - mean[inv]
    sq = _group_sum(centred ** 2, inv, len(count))
    std = torch.sqrt(sq / (count - 1).clamp_min(1.0))
    single = count[inv] == 1
    mean_i = torch.where(single, torch.zeros_like(scores), mean[inv])
    std_i = torch.where(single, torch.ones_like(scores), std[inv])
    adv = (scores - mean_i) / (std_i + epsilon) if norm_adv_by_std_in_grpo else scores - mean_i
    adv = adv.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est("rloo")
def compute_rloo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                   index, epsilon: float = 1e-6, config=None, **kwargs):
    """r_i minus the mean of the group's other rewards: n/(n-1) (r_i - mean_g)."""
    scores = token_level_rewards.sum(dim=-1).to(torch.float64)
    inv, count = _groups(index)
    mean = _group_sum(scores, inv, len(count)) / count
    n = count[inv]
    adv = torch.where(n > 1, (scores - mean[inv]) * n / (n - 1).clamp_min(1.0), scores)
    adv = adv.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_outcome_advantage(
        token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
        epsilon: float = 1e-6, config=None, **kwargs):
    """r_i - mean_g on every response token, then whitened over all the batch's response
    tokens (so longer replies weigh more in the batch statistics)."""
    scores = token_level_rewards.sum(dim=-1).to(torch.float64)
    inv, count = _groups(index)
    mean = _group_sum(scores, inv, len(count)) / count
    centred = torch.where(count[inv] > 1, scores - mean[inv], scores)
    mask = response_mask.to(torch.float64)
    tokens = centred.unsqueeze(-1) * mask
    adv = (_masked_whiten(tokens, mask) * mask).to(token_level_rewards.dtype)
    return adv, adv


def sequence_advantages(name: str, scores, index, lengths=None, **kwargs) -> np.ndarray:
    """One advantage per sample from one reward per sample (placed on its last response
    token, as verl's reward managers place it) and its response length (tokens; all 1 when
    not given). `kwargs`: the estimator's own (epsilon, norm_adv_by_std_in_grpo)."""
    scores = torch.as_tensor(np.asarray(scores, dtype=np.float64))
    n = len(scores)
    lengths = np.ones(n, dtype=np.int64) if lengths is None else np.asarray(lengths, np.int64)
    T = max(int(lengths.max()) if n else 1, 1)
    mask = (torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None]).to(torch.float64)
    rewards = torch.zeros((n, T), dtype=torch.float64)
    last = torch.as_tensor(np.maximum(lengths - 1, 0))
    rewards[torch.arange(n), last] = scores
    adv, _ = get_adv_estimator_fn(name)(rewards, mask, index, **kwargs)
    # every token of a row carries the row's value; a row without tokens gets 0
    return (adv.sum(-1) / mask.sum(-1).clamp_min(1.0)).numpy()
