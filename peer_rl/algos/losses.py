"""Policy losses and their aggregation, with verl's names and call shapes (verl 0.9.1's
`core_algos`): `get_policy_loss_fn(name)(old_log_prob, log_prob, advantages, response_mask,
loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)` and `agg_loss`.

`config` is anything holding `clip_ratio`, `clip_ratio_low`, `clip_ratio_high`, `clip_ratio_c`
and `global_batch_info`, as attributes or keys (verl's ActorConfig, a dict, our schema).
`global_batch_info` carries what a micro-batch cannot see: the data-parallel size, the tokens
and sequences of the whole mini-batch, the constant of the `-norm` mode. With it each
micro-batch's loss is its exact share of the mini-batch's, so gradients accumulated over
micro-batches and averaged over ranks equal the one-batch gradient, in every mode.
"""
from __future__ import annotations

import torch

from peer_rl.algos.registry import LOSS_AGG_MODES, make_registry

POLICY_LOSSES, register_policy_loss, get_policy_loss_fn = make_registry(
    "actor.policy_loss.loss_mode")


def _get(config, key: str, default=None):
    """A key of any config: an attribute, a mapping key, or the default."""
    if config is None:
        return default
    if isinstance(config, dict):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis=None) -> torch.Tensor:
    """Sum over the masked positions; a NaN outside the mask does not leak in."""
    return (torch.where(mask.bool(), values, 0.0) * mask).sum(axis=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the masked positions (0 when none)."""
    return masked_sum(values, mask) / mask.sum().clamp_min(1.0)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str,
             dp_size: int = 1, batch_num_tokens=None, global_batch_size=None,
             loss_scale_factor=None) -> torch.Tensor:
    """The loss matrix to a scalar (verl's modes):

    token-mean               sum of token losses / tokens of the mini-batch
    token-sum                sum of token losses
    seq-mean-token-sum       mean over sequences of each sequence's token sum
    seq-mean-token-mean      mean over sequences of each sequence's token mean
    seq-mean-token-sum-norm  seq-mean-token-sum / loss_scale_factor (Dr. GRPO: a constant,
                             verl's default the mask's width)

    Given `batch_num_tokens` / `global_batch_size` of the whole mini-batch this is a
    micro-batch's share of it, times `dp_size` (data-parallel averaging undoes that); a
    sequence without tokens counts in no mean."""
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = loss_mask.sum()
        return masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        tokens = loss_mask.sum(dim=-1)
        seq = (loss_mat * loss_mask).sum(dim=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq = seq / (tokens + 1e-8)
        has = (tokens > 0).to(loss_mat.dtype)
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = has.sum()
        loss = masked_sum(seq, has) / global_batch_size * dp_size
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    raise ValueError(f"actor.loss_agg_mode={loss_agg_mode!r}; expected one of {LOSS_AGG_MODES}")


def _clip_range(config) -> tuple[float, float]:
    eps = _get(config, "clip_ratio", 0.2)
    return _get(config, "clip_ratio_low", eps), _get(config, "clip_ratio_high", eps)


def _batch_info(config) -> dict:
    return dict(_get(config, "global_batch_info", {}) or {})


def _pg_metrics(loss1, loss2, neg_kl, mask, lower) -> dict:
    """verl's three: tokens clipped, KL to the old policy, tokens held by the dual clip."""
    return {"actor/pg_clipfrac": masked_mean((loss2 > loss1).float(), mask).item(),
            "actor/ppo_kl": masked_mean(-neg_kl, mask).item(),
            "actor/pg_clipfrac_lower": lower}


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask,
                                loss_agg_mode: str = "token-mean", config=None,
                                rollout_is_weights=None):
    """PPO's clipped surrogate with decoupled bounds [1 - clip_ratio_low, 1 + clip_ratio_high]
    (DAPO's clip-higher) and dual clip: for A < 0 the loss is capped at -A * clip_ratio_c
    (Ye et al. 2019), so a ratio far above 1 on a bad token cannot blow the step up.
    `rollout_is_weights` (no gradient) multiply each token's loss (decoupled PPO's
    pi_old / pi_behavior for samples an older policy drew)."""
    low, high = _clip_range(config)
    clip_c = _get(config, "clip_ratio_c", 3.0)
    if clip_c <= 1.0:
        raise ValueError(f"actor.clip_ratio_c={clip_c}: the dual-clip bound must exceed 1")
    neg_kl = (log_prob - old_log_prob).clamp(-20.0, 20.0)
    ratio = torch.exp(neg_kl)
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1 - low, 1 + high)
    clipped = torch.maximum(loss1, loss2)
    loss3 = -advantages * clip_c
    dual = torch.minimum(loss3, clipped)
    losses = torch.where(advantages < 0, dual, clipped)
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    loss = agg_loss(losses, response_mask, loss_agg_mode, **_batch_info(config))
    lower = masked_mean((clipped > loss3).float() * (advantages < 0).float(), response_mask)
    return loss, _pg_metrics(loss1, loss2, neg_kl, response_mask, lower.item())


@register_policy_loss("gspo")
def compute_policy_loss_gspo(old_log_prob, log_prob, advantages, response_mask,
                             loss_agg_mode: str = "seq-mean-token-mean", config=None,
                             rollout_is_weights=None):
    """GSPO (Zheng et al. 2025): one ratio per sequence, the geometric mean of its token
    ratios, clipped; its gradient flows through each token as sg[s_i] * pi / sg[pi]."""
    low, high = _clip_range(config)
    neg_kl = log_prob - old_log_prob
    lengths = response_mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = (neg_kl * response_mask).sum(dim=-1) / lengths
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(log_ratio.clamp(max=10.0))
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1 - low, 1 + high)
    losses = torch.maximum(loss1, loss2)
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    loss = agg_loss(losses, response_mask, loss_agg_mode, **_batch_info(config))
    return loss, _pg_metrics(loss1, loss2, neg_kl, response_mask, 0.0)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str = "low_var_kl"):
    """Per-token KL(pi || pi_ref). 'low_var_kl' is Schulman's k3: exp(r) - r - 1, r = ref - logp."""
    if kind == "kl":      # k1
        return logprob - ref_logprob
    if kind == "low_var_kl":
        r = (ref_logprob - logprob).clamp(-20.0, 20.0)
        return (torch.exp(r) - r - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"actor.kl_loss_type={kind!r}; expected 'low_var_kl' or 'kl'")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
