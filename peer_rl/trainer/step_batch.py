"""The policy update's input (stage 7), built from a step's samples and advantages."""
from __future__ import annotations

import numpy as np

from peer_rl.protocol import UpdateBatch


def update_batch(samples: list, advantages: np.ndarray, max_staleness: int = 0,
                 temperature: float = 1.0) -> UpdateBatch:
    """The policy update's input: right-padded prompt + response rows, the response mask (the
    loss covers response tokens only), advantages; with a staleness bound, also the sampler's
    log-probs and each sample's policy version (decoupled PPO's weight, the bound's check).
    Each row carries its group's uid: the update keeps a group's rows together, so the part of
    their prompts they share runs once (ESCRAG-R1's refined prompts share the dialogue)."""
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    T = max(len(x) for x in seqs)
    n = len(seqs)
    input_ids = np.zeros((n, T), dtype=np.int64)
    attention = np.zeros((n, T), dtype=np.int64)
    response = np.zeros((n, T), dtype=np.int64)
    for i, (s, seq) in enumerate(zip(samples, seqs)):
        input_ids[i, :len(seq)] = seq
        attention[i, :len(seq)] = 1
        response[i, len(s.prompt_ids):len(seq)] = 1
    extra = {}
    if max_staleness:
        behavior = np.zeros((n, T), dtype=np.float32)
        for i, s in enumerate(samples):
            start = len(s.prompt_ids)
            behavior[i, start:start + len(s.response_logprobs)] = s.response_logprobs
        extra = {"behavior_log_probs": behavior, "max_staleness": max_staleness,
                 "policy_versions": np.array([s.policy_version for s in samples])}
    if any(s.images for s in samples):   # the frames the engine saw: the update sees them too
        extra["images"] = [list(s.images) for s in samples]
    return UpdateBatch(input_ids, attention, response, advantages.astype(np.float32),
                       temperature=temperature,
                       group_ids=np.array([s.uid for s in samples], dtype=np.int64), **extra)
