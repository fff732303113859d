"""Advantages for whole conversations: a GRPO group is G dialogues from one seeker profile and
opening, each a run of policy turns, each turn a trained row.

Two rewards meet here: PEER's per turn (UnifiReward, reweighted by RUR: `turn_rewards[d][t]`) and
the dialogue's (the seeker's final emotion, peer_rl.algos.emotion: `dialogue_rewards[d]`), mixed
by `turn_weight` and `dialogue_weight`. Two ways to hand them to the turns:

- `outcome`: one score per dialogue, turn_weight x (its turns' mean reward) + dialogue_weight x
  its dialogue reward, normalised within the group (GRPO); every turn of the dialogue carries it.
- `turn`: turn credit. Turn t's PEER reward is normalised against the group's other dialogues at
  the same turn (those that reached it; a turn no other dialogue reached gets 0 from this part),
  and the dialogue reward's group-normalised advantage is added: turn_weight x A_turn(d, t) +
  dialogue_weight x A_dialogue(d).

Normalisation is the GRPO estimator's (peer_rl.algos.advantages): (x - group mean) / (group
std + epsilon), std unbiased as verl's; a group of one keeps its raw score.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

CREDITS = ("outcome", "turn")            # dialogue.credit (the config reads it without torch)


def _grpo(scores: Sequence[float], index: Sequence[int], epsilon: float) -> np.ndarray:
    from peer_rl.algos.advantages import sequence_advantages  # deferred: torch

    if not len(scores):
        return np.zeros(0)
    return sequence_advantages("grpo", np.asarray(scores, np.float64),
                               np.asarray(index, np.int64), epsilon=epsilon)


def dialogue_advantages(turn_rewards: Sequence[Sequence[float]], dialogue_rewards: Sequence[float],
                        groups: Sequence[int], credit: str = "outcome", turn_weight: float = 1.0,
                        dialogue_weight: float = 1.0, epsilon: float = 1e-6) -> list[np.ndarray]:
    """Per dialogue d (group id `groups[d]`), one advantage for each of its turns."""
    if credit not in CREDITS:
        raise ValueError(f"dialogue.credit={credit!r}: expected one of {CREDITS}")
    n = len(turn_rewards)
    if len(dialogue_rewards) != n or len(groups) != n:
        raise ValueError(f"dialogue advantages: {n} dialogues' turn rewards, "
                         f"{len(dialogue_rewards)} dialogue rewards, {len(groups)} group ids")
    if any(len(t) == 0 for t in turn_rewards):
        raise ValueError("dialogue advantages: a dialogue without a policy turn")
    if credit == "outcome":
        scores = [turn_weight * float(np.mean(t)) + dialogue_weight * float(r)
                  for t, r in zip(turn_rewards, dialogue_rewards)]
        adv = _grpo(scores, groups, epsilon)
        return [np.full(len(t), a) for t, a in zip(turn_rewards, adv)]
    dialogue_adv = _grpo([float(r) for r in dialogue_rewards], groups, epsilon)
    slots = {}                                 # (group, turn) -> its index for the estimator
    flat, index = [], []
    for d, rewards in enumerate(turn_rewards):
        for t, r in enumerate(rewards):
            flat.append(float(r))
            index.append(slots.setdefault((int(groups[d]), t), len(slots)))
    counts = np.bincount(index)
    turn_adv = np.where(counts[index] > 1, _grpo(flat, index, epsilon), 0.0)
    out, k = [], 0
    for d, rewards in enumerate(turn_rewards):
        out.append(turn_weight * turn_adv[k:k + len(rewards)] + dialogue_weight * dialogue_adv[d])
        k += len(rewards)
    return out
