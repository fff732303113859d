"""Dynamic sampling (DAPO; verl's `algorithm.filter_groups`): which groups carry a learning
signal, and the step's batch assembled from the groups that do.

A group whose samples all score alike gets advantage 0 from every estimator here (GRPO, RLOO,
REINFORCE++-baseline's centring): it costs a rollout, a judge call and an update and teaches
nothing but the KL term. PEER's reward moves in steps of 0.5 on [0, 3] and G is 4, so such
groups are common. The share is logged every step, filtering on or off.

Pure functions over `ScoredBatch`es: the controller draws and scores, this module chooses.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from peer_rl.methods.scored_batch import ScoredBatch
from peer_rl.protocol import Similarities

COUNT_METRICS = ("judge/asked",)       # summed over generation batches, the rest averaged


def group_values(scored: ScoredBatch, metric: str, group_size: int) -> np.ndarray:
    """(groups, G) of the chosen per-sample value: reward (r_i), final (r~_i, what the
    advantages use) or format (all four steps present)."""
    if metric == "reward":
        values = np.asarray(scored.rewards, dtype=np.float64)
    elif metric == "final":
        values = np.asarray(scored.final, dtype=np.float64)
    elif metric == "format":
        values = np.array([float(p.complete) for p in scored.parsed])
    else:
        raise ValueError(f"algorithm.filter_groups.metric={metric!r}; expected reward, final "
                         "or format")
    uids = np.array([s.uid for s in scored.samples])
    groups = np.unique(uids)
    return np.stack([values[uids == g] for g in groups]) if len(groups) else \
        np.zeros((0, group_size))


def zero_variance(values: np.ndarray, atol: float = 1e-9) -> np.ndarray:
    """(groups,) True where every sample of the group has the same value."""
    if values.size == 0:
        return np.zeros(0, dtype=bool)
    return np.ptp(values, axis=1) <= atol


def select_groups(rows: list[dict], scored: ScoredBatch, keep: list[int]
                  ) -> tuple[list[dict], ScoredBatch]:
    """The groups `keep` (prompt positions in `rows`), renumbered 0..k-1 in that order."""
    new_uid = {g: i for i, g in enumerate(keep)}
    idx = [k for k, s in enumerate(scored.samples) if s.uid in new_uid]
    idx.sort(key=lambda k: (new_uid[scored.samples[k].uid], k))
    pick = np.asarray(idx, dtype=np.int64)
    red = scored.redundancy.take(pick) if scored.redundancy is not None else None
    return [rows[g] for g in keep], ScoredBatch(
        samples=[replace(scored.samples[k], uid=new_uid[scored.samples[k].uid]) for k in idx],
        parsed=[scored.parsed[k] for k in idx], replies=[scored.replies[k] for k in idx],
        rewards=np.asarray(scored.rewards)[pick], final=np.asarray(scored.final)[pick],
        redundancy=red, metrics=dict(scored.metrics),
        judge_raw=[scored.judge_raw[k] for k in idx])


def concat(parts: list[tuple[list[dict], ScoredBatch]]) -> tuple[list[dict], ScoredBatch]:
    """Several batches' rows and samples as one, uids shifted past the earlier batches'."""
    rows: list[dict] = []
    samples, parsed, replies, judge_raw = [], [], [], []
    rewards, final, reds = [], [], []
    for part_rows, sb in parts:
        samples += [replace(s, uid=s.uid + len(rows)) for s in sb.samples]
        rows += part_rows
        parsed += sb.parsed
        replies += sb.replies
        judge_raw += sb.judge_raw
        rewards.append(np.asarray(sb.rewards))
        final.append(np.asarray(sb.final))
        reds.append(sb.redundancy)
    red = None
    if parts and all(r is not None for r in reds):
        red = Similarities.concat(reds)
    return rows, ScoredBatch(samples=samples, parsed=parsed, replies=replies,
                             rewards=np.concatenate(rewards) if rewards else np.zeros(0),
                             final=np.concatenate(final) if final else np.zeros(0),
                             redundancy=red, metrics={}, judge_raw=judge_raw)


def merge_metrics(batches: list[ScoredBatch]) -> dict:
    """The stages' metrics over every generation batch of a step: counts summed, the rest
    (rates and means) weighted by each batch's samples."""
    out: dict = {}
    total = sum(len(b.samples) for b in batches) or 1
    for key in {k for b in batches for k in b.metrics}:
        have = [b for b in batches if key in b.metrics]
        if key in COUNT_METRICS:
            out[key] = sum(b.metrics[key] for b in have)
        else:
            weight = sum(len(b.samples) for b in have) or total
            out[key] = sum(b.metrics[key] * len(b.samples) for b in have) / weight
    return out


def zero_variance_metrics(batches: list[ScoredBatch], group_size: int) -> dict:
    """Share of the step's drawn groups whose reward, or whose final (advantage-input) value,
    is the same for every sample."""
    out = {}
    for metric in ("reward", "final"):
        flags = np.concatenate([zero_variance(group_values(b, metric, group_size))
                                for b in batches]) if batches else np.zeros(0)
        out[f"groups/zero_variance_share/{metric}"] = float(flags.mean()) if flags.size else 0.0
    return out
