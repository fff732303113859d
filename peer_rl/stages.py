"""The stages both methods share: seeded generation from the rollout pool and the RUR
reweighting from the redundancy pool (PEER: peer_rl.peer_scoring, ESCRAG-R1:
peer_rl.rag_rollout)."""
from __future__ import annotations

import time

import numpy as np

from peer_rl.protocol import Prompt, SamplingConfig, seeded
from peer_rl.rewards import rur_reweight


def generate(ctrl, prompts: list[Prompt], n: int, stream: str = "rollout") -> list:
    """n samples per prompt from the rollout pool, each request seeded by (run seed, step,
    stream, position)."""
    cfg = ctrl.cfg
    seeded(prompts, cfg.trainer.seed, ctrl.scoring_step, stream, n)
    sampling = SamplingConfig(n=n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                              max_tokens=cfg.rollout.response_length, seed=cfg.trainer.seed)
    return ctrl.rollout.scatter("generate", prompts, sampling)


def redundancy(ctrl, batch_rows: list[dict], replies: list[str], rewards: np.ndarray,
               timing) -> tuple[dict | None, np.ndarray]:
    """Stage 5, RUR (`algorithm.rur.enable`): s_hist, s_group, tau from the redundancy pool,
    r~ = r / ((1 + tau s_hist)(1 + tau s_group)). Off: r~ = r."""
    t = time.perf_counter()
    red, final = None, rewards
    if ctrl.cfg.algorithm.rur.enable:
        histories = [[u["content"] for u in r["history"]] for r in batch_rows]
        red = ctrl.redundancy.map("similarities", [replies], histories, ctrl.G)[0]
        final = rur_reweight(rewards, red["s_hist"], red["s_group"], red["tau"])
    timing["redundancy"] = time.perf_counter() - t
    return red, final
