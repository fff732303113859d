"""What a method returns for one step (stages 2-5): the scored batch the advantages, the update
and the metrics read."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from peer_rl.protocol import Similarities


@dataclass
class ScoredBatch:
    """Stages 2-5 of a step: what the advantages, the update and the metrics need."""
    samples: list              # protocol.Sample per sequence, prompt-major (rollout.n each)
    parsed: list               # each sample's parsed output (the reasoning steps, the reply)
    replies: list[str]         # the text each sample is judged and compared by
    rewards: np.ndarray        # r_i from the reward model
    reweighted: np.ndarray     # r~_i after RUR (r_i when RUR is off): the advantages' input
    redundancy: Similarities | None   # s_hist, s_group, tau, n_words per sample (RUR on)
    metrics: dict              # the stages' own metrics (reward/..., judge/..., retrieval/...)
    judge_raw: list            # the judge's answers per sample (None for a scalar RM)
    # the method's own advantages per sample, where its rows are not one GRPO group per prompt
    # (whole conversations: peer_rl.algos.turn_credit); None: the controller's estimator
    advantages: np.ndarray | None = None
    dialogues: list | None = None      # whole conversations: each dialogue (the samples file)


def judge_frames(row: dict) -> list[str]:
    """The frame the judge sees in its Step 2 round: the last of the row's frames. SER rows,
    which the judge is trained on, show one frame; GRPO visual rows carry two, taken at 1/2 and
    3/4 of the seeker's utterance, and the later one is the expression the reply answers."""
    return list(row.get("images") or [])[-1:]
