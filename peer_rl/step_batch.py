"""What one GRPO step carries between its stages: the scored batch (stages 2-5) and the policy
update's input (stage 7)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ScoredBatch:
    """Stages 2-5 of a step: what the advantages, the update and the metrics need."""
    samples: list              # protocol.Sample per sequence, prompt-major (rollout.n each)
    parsed: list               # each sample's parsed output (the reasoning steps, the reply)
    replies: list[str]         # the text each sample is judged and compared by
    rewards: np.ndarray        # r_i from the reward model
    final: np.ndarray          # r~_i after RUR (r_i when RUR is off): the advantages' input
    redundancy: dict | None    # s_hist, s_group, tau, n_words per sample (RUR on)
    metrics: dict              # the stages' own metrics (reward/..., judge/..., retrieval/...)
    judge_raw: list            # the judge's answers per sample (None for a scalar RM)


def judge_frames(row: dict) -> list[str]:
    """The frame the judge sees in its Step 2 round: the last of the row's frames. SER rows,
    which the judge is trained on, show one frame; GRPO visual rows carry two, taken at 1/2 and
    3/4 of the seeker's utterance, and the later one is the expression the reply answers."""
    return list(row.get("images") or [])[-1:]


def update_batch(samples: list, advantages: np.ndarray, max_staleness: int = 0) -> dict:
    """The policy update's input: right-padded prompt + response rows, the response mask (the
    loss covers response tokens only), advantages; with a staleness bound, also the sampler's
    log-probs and each sample's policy version (decoupled PPO's weight, the bound's check)."""
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
    batch = {"input_ids": input_ids, "attention_mask": attention, "response_mask": response,
             "advantages": advantages.astype(np.float32)}
    if max_staleness:
        behavior = np.zeros((n, T), dtype=np.float32)
        for i, s in enumerate(samples):
            start = len(s.prompt_ids)
            behavior[i, start:start + len(s.response_logprobs)] = s.response_logprobs
        batch |= {"behavior_log_probs": behavior, "max_staleness": max_staleness,
                  "policy_versions": np.array([s.policy_version for s in samples])}
    if any(s.images for s in samples):   # the frames the engine saw: the update sees them too
        batch["images"] = [list(s.images) for s in samples]
    return batch
