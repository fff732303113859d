"""Dynamic sampling (DAPO; verl's `algorithm.filter_groups`): which groups carry a learning
signal, and the step's batch assembled from the groups that do.

A group whose samples all score alike gets advantage 0 from every estimator here (GRPO, RLOO,
REINFORCE++-baseline's centring): it costs a rollout, a judge call and an update and teaches
nothing but the KL term. PEER's reward (default weights) moves in steps of 0.5 on [0, 3] and G
is 4, so such groups are common. The share is logged every step, filtering on or off.

Pure functions over `ScoredBatch`es: the controller draws and scores (`draw` below), this
module chooses. Where peer-rl and verl differ is tabled in docs/grpo-variants.md.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from peer_rl.methods.scored_batch import ScoredBatch
from peer_rl.protocol import Similarities

COUNT_METRICS = ("judge/asked",)       # summed over generation batches, the rest averaged
ON_LIMIT = ("raise", "train_short")


class DynamicSamplingLimit(RuntimeError):
    """max_num_gen_batches batches were drawn and the batch is still short (on_limit=raise)."""


def group_values(scored: ScoredBatch, metric: str) -> list[np.ndarray]:
    """Each group's chosen per-sample values, groups in uid order: reward (r_i), reweighted
    (r~_i, what the advantages use) or format (all four steps present). A batch that carries
    its method's own advantages (whole conversations: a group is G dialogues of any number of
    turns, so groups differ in size) gives those for `reweighted`: its advantages mix the
    turns' r~ with the dialogue's emotion."""
    if metric == "reward":
        values = np.asarray(scored.rewards, dtype=np.float64)
    elif metric == "reweighted" and scored.advantages is not None:
        values = np.asarray(scored.advantages, dtype=np.float64)
    elif metric == "reweighted":
        values = np.asarray(scored.reweighted, dtype=np.float64)
    elif metric == "format":
        values = np.array([float(p.complete) for p in scored.parsed])
    else:
        raise ValueError(f"algorithm.filter_groups.metric={metric!r}; expected reward, "
                         "reweighted or format")
    uids = np.array([s.uid for s in scored.samples])
    return [values[uids == g] for g in np.unique(uids)]


def zero_variance(values: list[np.ndarray], atol: float = 1e-9) -> np.ndarray:
    """(groups,) True where every sample of the group has the same value."""
    return np.array([np.ptp(v) <= atol for v in values], dtype=bool)


def select_groups(rows: list[dict], scored: ScoredBatch, keep: list[int]
                  ) -> tuple[list[dict], ScoredBatch]:
    """The groups `keep` (prompt positions in `rows`), renumbered 0..k-1 in that order, with
    their samples in their order (a dialogue's turns stay in turn order) and, for whole
    conversations, their dialogues and advantages."""
    new_uid = {g: i for i, g in enumerate(keep)}
    idx = [k for k, s in enumerate(scored.samples) if s.uid in new_uid]
    idx.sort(key=lambda k: (new_uid[scored.samples[k].uid], k))
    pick = np.asarray(idx, dtype=np.int64)
    redundancy = scored.redundancy.take(pick) if scored.redundancy is not None else None
    advantages = (np.asarray(scored.advantages)[pick] if scored.advantages is not None
                  else None)
    dialogues = None
    if scored.dialogues is not None:
        order = sorted((new_uid[d.uid], k) for k, d in enumerate(scored.dialogues)
                       if d.uid in new_uid)
        dialogues = [replace(scored.dialogues[k], uid=u) for u, k in order]
    return [rows[g] for g in keep], ScoredBatch(
        samples=[replace(scored.samples[k], uid=new_uid[scored.samples[k].uid]) for k in idx],
        parsed=[scored.parsed[k] for k in idx], replies=[scored.replies[k] for k in idx],
        rewards=np.asarray(scored.rewards)[pick], reweighted=np.asarray(scored.reweighted)[pick],
        redundancy=redundancy, metrics=dict(scored.metrics),
        judge_raw=[scored.judge_raw[k] for k in idx], advantages=advantages,
        dialogues=dialogues)


def concat(parts: list[tuple[list[dict], ScoredBatch]]) -> tuple[list[dict], ScoredBatch]:
    """Several batches' rows and samples as one, uids shifted past the earlier batches'."""
    rows: list[dict] = []
    samples, parsed, replies, judge_raw = [], [], [], []
    rewards, reweighted, similarities, advantages, dialogues = [], [], [], [], []
    for part_rows, sb in parts:
        samples += [replace(s, uid=s.uid + len(rows)) for s in sb.samples]
        advantages.append(sb.advantages)
        dialogues.append([replace(d, uid=d.uid + len(rows)) for d in sb.dialogues]
                         if sb.dialogues is not None else None)
        rows += part_rows
        parsed += sb.parsed
        replies += sb.replies
        judge_raw += sb.judge_raw
        rewards.append(np.asarray(sb.rewards))
        reweighted.append(np.asarray(sb.reweighted))
        similarities.append(sb.redundancy)
    redundancy = None
    if parts and all(r is not None for r in similarities):
        redundancy = Similarities.concat(similarities)
    whole = parts and all(d is not None for d in dialogues)     # whole conversations
    return rows, ScoredBatch(samples=samples, parsed=parsed, replies=replies,
                             rewards=np.concatenate(rewards) if rewards else np.zeros(0),
                             reweighted=np.concatenate(reweighted) if reweighted else np.zeros(0),
                             redundancy=redundancy, metrics={}, judge_raw=judge_raw,
                             advantages=np.concatenate(advantages) if whole else None,
                             dialogues=[d for part in dialogues for d in part] if whole
                             else None)


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


def zero_variance_metrics(batches: list[ScoredBatch]) -> dict:
    """Share of the step's drawn groups whose reward, or whose reweighted (advantage-input)
    value, is the same for every sample."""
    out = {}
    for metric in ("reward", "reweighted"):
        flags = np.concatenate([zero_variance(group_values(b, metric))
                                for b in batches]) if batches else np.zeros(0)
        out[f"groups/zero_variance_share/{metric}"] = float(flags.mean()) if flags.size else 0.0
    return out


def refill(first: tuple[list[dict], ScoredBatch], draw, fg, batch_size: int, step: int
           ) -> tuple[list[dict], ScoredBatch, str | None]:
    """A step's batch under dynamic sampling: the groups of `first` (rows, scored) whose
    `fg.metric` varies, then of further batches from `draw()`, until `batch_size` groups are
    kept (the first ones, in draw order). `fg.max_num_gen_batches` (0 = no limit, as verl)
    bounds the draws; at the limit with the batch short, `fg.on_limit=raise` stops the run
    (verl's DAPO recipe) and `train_short` trains on the kept groups, or on the first batch
    when none was kept. Returns (rows, scored with the step's metrics, a line saying what was
    trained when the batch is short, else None)."""
    rows, scored = first
    drawn, kept, tied = [first], [], []
    while True:
        flags = zero_variance(group_values(scored, fg.metric))
        tied += flags.tolist()
        kept.append(select_groups(rows, scored, [g for g, z in enumerate(flags) if not z]))
        n_kept = sum(len(r) for r, _ in kept)
        if n_kept >= batch_size or (fg.max_num_gen_batches and
                                    len(drawn) >= fg.max_num_gen_batches):
            break
        rows, scored = draw()
        drawn.append((rows, scored))
    short = (f"step {step}: dynamic sampling kept {n_kept} of {batch_size} group(s) whose "
             f"{fg.metric} varies after {len(drawn)} batch(es) (algorithm.filter_groups."
             f"max_num_gen_batches={fg.max_num_gen_batches})")
    if n_kept < batch_size and fg.on_limit == "raise":
        raise DynamicSamplingLimit(
            f"{short}; algorithm.filter_groups.on_limit=raise stops here, as verl's DAPO recipe "
            "does. Set algorithm.filter_groups.max_num_gen_batches=0 to draw until the batch is "
            "full, or on_limit=train_short to train on the groups kept")
    batches = [sb for _, sb in drawn]
    metrics = merge_metrics(batches) | zero_variance_metrics(batches)
    if n_kept == 0:       # nothing kept: the first batch, as it is
        out_rows, out = drawn[0]
    else:
        out_rows, out = concat(kept)
        out_rows, out = select_groups(out_rows, out, list(range(min(n_kept, batch_size))))
    note = None
    if n_kept < batch_size:
        note = f"{short}; training on " + (first_batch_note(out, fg.metric)
                                           if n_kept == 0 else f"those {n_kept}")
    out.metrics = metrics | {"filter/gen_batches": len(drawn),
                             "filter/zero_variance_share": float(np.mean(tied)),
                             "filter/kept_groups": min(n_kept, batch_size),
                             "filter/short": float(n_kept < batch_size)}
    return out_rows, out, note


def first_batch_note(scored: ScoredBatch, metric: str) -> str:
    """What training on a batch whose groups all tie on `metric` means for its advantages,
    which come from `reweighted`: all 0 only when `reweighted` ties in every group too."""
    if metric == "reweighted":
        return "the first batch, whose advantages are all 0"
    tied = zero_variance(group_values(scored, "reweighted"))
    if tied.all():
        return (f"the first batch, whose {metric} and reweighted both tie in every group: "
                "advantages all 0")
    return (f"the first batch: its {metric} ties in every group, but reweighted (what the "
            f"advantages are computed from) varies in {int((~tied).sum())} of its {len(tied)} "
            "group(s), whose advantages are not 0")
