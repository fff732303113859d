"""GRPO math, in plain torch and named after verl's core_algos.

Advantage estimators are registered by name (`algorithm.adv_estimator`); nothing here needs a
model, Ray or a config object.
"""
from __future__ import annotations

from typing import Callable

import torch

ADV_ESTIMATORS: dict[str, Callable] = {}


def register_adv_estimator(name: str):
    def deco(fn):
        ADV_ESTIMATORS[name] = fn
        return fn
    return deco


@register_adv_estimator("grpo")
def compute_grpo_outcome_advantage(scores: torch.Tensor, index: torch.Tensor, epsilon: float = 1e-6,
                                   norm_adv_by_std_in_grpo: bool = True) -> torch.Tensor:
    """A_i = (r~_i - mean_g) / (std_g + eps) over the samples sharing a prompt index.

    scores (N,) sequence rewards; index (N,) prompt id. std is unbiased (verl's torch.std);
    a group of one gets advantage 0.
    """
    scores = scores.to(torch.float64)
    _, inv = torch.unique(index, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(k, dtype=torch.float64).scatter_add_(0, inv, torch.ones_like(scores))
    mean = torch.zeros(k, dtype=torch.float64).scatter_add_(0, inv, scores) / count
    centred = scores - mean[inv]
    sq = torch.zeros(k, dtype=torch.float64).scatter_add_(0, inv, centred ** 2)
    std = torch.sqrt(sq / (count - 1).clamp_min(1.0))  # unbiased, as torch.std
    adv = centred / (std[inv] + epsilon) if norm_adv_by_std_in_grpo else centred
    adv = torch.where(count[inv] > 1, adv, torch.zeros_like(adv))
    return adv.to(torch.float32)


def get_adv_estimator(name: str) -> Callable:
    if name not in ADV_ESTIMATORS:
        raise KeyError(f"algorithm.adv_estimator={name!r}; known: {sorted(ADV_ESTIMATORS)}")
    return ADV_ESTIMATORS[name]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean over all valid tokens of the batch (verl's loss_agg_mode='token-mean')."""
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str = "low_var_kl"):
    """Per-token KL(pi || pi_ref). 'low_var_kl' is Schulman's k3: exp(r) - r - 1, r = ref - logp."""
    if kind == "kl":      # k1
        return logprob - ref_logprob
    if kind == "low_var_kl":
        r = (ref_logprob - logprob).clamp(-20.0, 20.0)
        return (torch.exp(r) - r - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"actor.kl_loss_type={kind!r}; expected 'low_var_kl' or 'kl'")


def compute_policy_loss(old_logprob, logprob, advantages, response_mask, clip_ratio: float = 0.2,
                        behavior_weight=None):
    """PPO/GRPO clipped surrogate, token-mean. Returns (loss, clip_fraction, approx_kl_to_old).

    `behavior_weight` (no gradient): decoupled PPO's pi_old / pi_behavior per token, for samples
    drawn by an older policy than the one the ratio is clipped around (trainer.async_training)."""
    log_ratio = (logprob - old_logprob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio)
    surrogate = torch.maximum(unclipped, clipped)
    if behavior_weight is not None:
        surrogate = surrogate * behavior_weight
    loss = masked_mean(surrogate, response_mask)
    clip_frac = masked_mean((clipped > unclipped).float(), response_mask)
    approx_kl = masked_mean(-log_ratio, response_mask)
    return loss, clip_frac.detach(), approx_kl.detach()


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
