"""The stages both methods share: seeded generation from the rollout pool and the RUR
reweighting from the redundancy pool."""
from __future__ import annotations

import time

import numpy as np

from peer_rl.protocol import Prompt, SamplingConfig, Similarities, seeded
from peer_rl.algos.rewards import rur_reweight


def generate(rollout, prompts: list[Prompt], sampling: SamplingConfig, step: int,
             stream: str = "rollout") -> list:
    """`sampling.n` samples per prompt from the rollout pool, each request seeded by (run seed,
    step, stream, position); results prompt-major."""
    seeded(prompts, sampling.seed, step - 1, stream, sampling.n)
    samples = rollout.call("generate", prompts, sampling, step=step)
    if len(samples) != len(prompts) * sampling.n:
        raise RuntimeError(f"rollout ({stream}) returned {len(samples)} samples for "
                           f"{len(prompts)} prompts x n={sampling.n}")
    return samples


def reweight(redundancy, rows: list[dict], replies: list[str], rewards: np.ndarray, n: int,
             step: int, timing) -> tuple[Similarities | None, np.ndarray]:
    """Stage 5, RUR: s_hist, s_group, tau from the redundancy pool,
    r~ = r / P for r >= 0, r * P for r < 0, P = (1 + tau s_hist)(1 + tau s_group)
    (peer_rl.algos.rewards.rur_reweight). Without a redundancy pool (RUR off): r~ = r."""
    t = time.perf_counter()
    similarities, reweighted = None, rewards
    if redundancy is not None:
        histories = [[u["content"] for u in r["history"]] for r in rows]
        similarities = redundancy.call("similarities", replies, histories, n, step=step)
        reweighted = rur_reweight(rewards, similarities.s_hist, similarities.s_group,
                                  similarities.tau)
    timing["redundancy"] = time.perf_counter() - t
    return similarities, reweighted
