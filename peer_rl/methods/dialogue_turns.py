"""Whole conversations seen turn by turn: each policy turn of each dialogue
(peer_rl.methods.dialogue_rollout) becomes one trained row, and these functions give what the
rest of a step needs of those rows, in one order (dialogue by dialogue, turn by turn):

- the samples, each carrying its dialogue's group (the GRPO group is the profile's G dialogues);
- what UnifiReward judges per turn: the turn's Steps 1-3 and reply against the dialogue so far.
  A simulated dialogue has no reference reply, so the outcome round is not asked: the turn's
  reward is the process part and the format, and the outcome is the seeker's emotion
  (peer_rl.algos.emotion, per dialogue);
- RUR's inputs: the turn's reply against the dialogue's own earlier replies (its history) and
  against the replies the group's other dialogues gave at the same turn (its in-group peers);
- the metrics of a step: turns, the emotion trajectory's start, end and mean, how dialogues
  ended, and the mean reward at each turn.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from peer_rl.algos.emotion import ENDS
from peer_rl.protocol import JudgeItem


def turns(dialogues: list) -> list[tuple[int, int]]:
    """(dialogue, turn) of every trained row, in row order."""
    return [(d, t) for d, dialogue in enumerate(dialogues) for t in range(len(dialogue.turns))]


def turn_samples(dialogues: list) -> list:
    """Each turn's protocol.Sample, its uid the dialogue's group."""
    out = []
    for d, t in turns(dialogues):
        sample = dialogues[d].turns[t].sample
        sample.uid = dialogues[d].uid
        out.append(sample)
    return out


def turn_judge_items(dialogues: list) -> list[JudgeItem]:
    """What UnifiReward is asked of each turn (no reference reply: no outcome round)."""
    items = []
    for d, t in turns(dialogues):
        turn, lang = dialogues[d].turns[t], dialogues[d].profile.language
        items.append(JudgeItem(history=turn.history, lang=lang,
                               steps=[turn.parsed.steps.get(j) or None for j in (1, 2, 3)],
                               reply=turn.parsed.reply, reference=None, candidate_first=True,
                               format_complete=turn.parsed.complete))
    return items


def turn_histories(dialogues: list) -> list[list[str]]:
    """RUR's history of each turn: the replies its dialogue gave before it."""
    return [[u.parsed.reply for u in dialogues[d].turns[:t]] for d, t in turns(dialogues)]


def turn_peers(dialogues: list) -> np.ndarray:
    """RUR's in-group id of each turn: one id per (group, turn number)."""
    ids: dict[tuple[int, int], int] = {}
    return np.array([ids.setdefault((dialogues[d].uid, t), len(ids))
                     for d, t in turns(dialogues)], dtype=np.int64)


def per_dialogue(dialogues: list, values) -> list[np.ndarray]:
    """A per-row array split back into each dialogue's turns."""
    values = np.asarray(values)
    cuts = np.cumsum([len(d.turns) for d in dialogues])[:-1]
    return list(np.split(values, cuts))


def dialogue_metrics(dialogues: list, turn_rewards) -> dict:
    """The step's dialogue/... metrics (docs/metrics.md)."""
    n = len(dialogues)
    m = {"dialogue/turns_mean": float(np.mean([len(d.turns) for d in dialogues])),
         "dialogue/emotion_start": float(np.mean([d.trajectory[0] for d in dialogues])),
         "dialogue/emotion_end": float(np.mean([d.trajectory[-1] for d in dialogues])),
         "dialogue/emotion_mean": float(np.mean([np.mean(d.trajectory) for d in dialogues]))}
    ends = Counter(d.end for d in dialogues)
    m |= {f"dialogue/end_{name}": ends.get(name, 0) / n for name in ENDS}
    by_turn: dict[int, list[float]] = {}
    for rewards in per_dialogue(dialogues, turn_rewards):
        for t, r in enumerate(rewards):
            by_turn.setdefault(t + 1, []).append(float(r))
    m |= {f"dialogue/turn{t}_reward": float(np.mean(v)) for t, v in sorted(by_turn.items())}
    return m
