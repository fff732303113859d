"""Run in a subprocess with verl 0.9.1's source on PYTHONPATH (tests/test_verl_parity.py):
peer-rl's and verl's functions of the same name on the same random tensors. Prints one JSON
object: {case: largest absolute difference} over values, gradients and metrics."""
import json
import sys

import numpy as np
import torch

import verl.trainer.ppo.core_algos as verl
from verl.workers.config import ActorConfig

from peer_rl import algos as ours

MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
         "seq-mean-token-sum-norm")


def batch(seed: int, n: int = 24, T: int = 9, G: int = 4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    lengths[3] = 0                                         # one row without a response token
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    uid = np.array([f"p{i // G}" for i in range(n)], dtype=object)
    uid[-1] = "alone"                                      # a group of one
    scores = torch.randint(0, 7, (n,), generator=g).float() / 2   # PEER's 0.5 steps on [0, 3]
    scores[4:8] = 1.5                                      # a zero-variance group
    rewards = torch.zeros(n, T)
    rows = torch.arange(n)
    rewards[rows, (lengths - 1).clamp(min=0)] = scores
    old = -torch.rand(n, T, generator=g) * 3
    new = old + torch.randn(n, T, generator=g) * 0.7       # ratios far from 1: clipping happens
    adv = torch.randn(n, 1, generator=g).expand(n, T).contiguous()
    weights = torch.rand(n, T, generator=g) * 2
    return rewards, mask, uid, old, new, adv, weights


def diff(a, b) -> float:
    a, b = (torch.as_tensor(x).detach().to(torch.float64) for x in (a, b))
    return float((a - b).abs().max())


def main() -> None:
    out = {}
    for seed in range(3):
        rewards, mask, uid, old, new, adv, weights = batch(seed)
        # advantages
        for name, kw in (("grpo", {"norm_adv_by_std_in_grpo": True}),
                         ("grpo", {"norm_adv_by_std_in_grpo": False}),
                         ("rloo", {}), ("reinforce_plus_plus_baseline", {})):
            mine = ours.get_adv_estimator_fn(name)(rewards.clone(), mask, uid, **kw)[0]
            theirs = verl.get_adv_estimator_fn(name)(
                token_level_rewards=rewards.clone(), response_mask=mask, index=uid, **kw)[0]
            key = f"adv/{name}" + ("/no_std" if kw.get("norm_adv_by_std_in_grpo") is False else "")
            out[key] = max(out.get(key, 0.0), diff(mine, theirs))
        # aggregation, with and without the global counts of a two-rank batch
        info = {"dp_size": 2, "batch_num_tokens": int(mask.sum()) + 5,
                "global_batch_size": 30, "loss_scale_factor": 12}
        loss_mat = torch.randn_like(old)
        for mode in MODES:
            for extra in ({}, info):
                key = f"agg/{mode}" + ("/global" if extra else "")
                out[key] = max(out.get(key, 0.0), diff(ours.agg_loss(loss_mat, mask, mode, **extra),
                                                       verl.agg_loss(loss_mat, mask, mode, **extra)))
        # policy losses: value, gradient and metrics, every mode, with and without weights
        for loss_mode, clip in (("vanilla", (0.2, 0.2, 3.0)), ("vanilla", (0.2, 0.28, 3.0)),
                                ("vanilla", (0.1, 0.1, 1.5)), ("gspo", (3e-4, 4e-4, 3.0))):
            for mode in MODES:
                for w in (None, weights):
                    cfg = ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=1,
                                      clip_ratio=clip[0], clip_ratio_low=clip[0],
                                      clip_ratio_high=clip[1], clip_ratio_c=clip[2],
                                      loss_agg_mode=mode)
                    cfg.global_batch_info.update(info)
                    mine_cfg = {"clip_ratio": clip[0], "clip_ratio_low": clip[0],
                                "clip_ratio_high": clip[1], "clip_ratio_c": clip[2],
                                "global_batch_info": dict(info)}
                    lp_a = new.clone().requires_grad_(True)
                    lp_b = new.clone().requires_grad_(True)
                    a, ma = ours.get_policy_loss_fn(loss_mode)(old, lp_a, adv, mask, mode,
                                                               mine_cfg, w)
                    b, mb = verl.get_policy_loss_fn(loss_mode)(old, lp_b, adv, mask, mode, cfg, w)
                    a.backward()
                    b.backward()
                    key = f"loss/{loss_mode}/{clip[1]}/{clip[2]}/{mode}"
                    d = max(diff(a, b), diff(lp_a.grad, lp_b.grad),
                            *(abs(ma[k] - float(mb[k])) for k in mb))
                    out[key] = max(out.get(key, 0.0), d)
        out["kl/low_var_kl"] = max(out.get("kl/low_var_kl", 0.0), diff(
            ours.kl_penalty(new, old, "low_var_kl"), verl.kl_penalty(new, old, "low_var_kl")))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
