"""PEER's stages 2-5: G samples per prompt, their reasoning parsed, UnifiReward's four rounds
and, for PEER-RUR, the redundancy reweighting. ESCRAG-R1's counterpart is peer_rl.rag_rollout.

Which candidate the judge sees first is a seeded coin per sample (the run seed and the step),
so the judge's position bias averages out and a rerun asks the same way."""
from __future__ import annotations

import time

import numpy as np

from peer_rl.protocol import JudgeItem, Prompt
from peer_rl.reasoning import parse_structured
from peer_rl.stages import generate, redundancy
from peer_rl.step_batch import ScoredBatch, judge_frames


def rollout(ctrl, batch_rows: list[dict], timing) -> list:
    """Stage 2: G samples per prompt."""
    prompts = [Prompt(uid=i, messages=r["messages"], images=list(r.get("images") or []))
               for i, r in enumerate(batch_rows)]
    t = time.perf_counter()
    samples = generate(ctrl, prompts, ctrl.G)
    timing["rollout"] = time.perf_counter() - t
    if len(samples) != len(prompts) * ctrl.G:
        raise RuntimeError(f"rollout returned {len(samples)} samples for "
                           f"{len(prompts)} prompts x n={ctrl.G}")
    return samples


def score_peer(ctrl, batch_rows: list[dict], timing, samples: list | None = None) -> ScoredBatch:
    """Stages 2-5 (stage 2 skipped when `samples` are given). No weights change here."""
    cfg = ctrl.cfg
    if samples is None:
        samples = rollout(ctrl, batch_rows, timing)

    parsed = [parse_structured(s.text) for s in samples]             # 3. parse + format
    replies = [p.reply(s.text) for p, s in zip(parsed, samples)]
    coin = np.random.default_rng([cfg.trainer.seed, ctrl.scoring_step]).random(len(samples)) < 0.5
    items = []
    for k, (s, p, reply) in enumerate(zip(samples, parsed, replies)):
        row = batch_rows[s.uid]
        items.append(JudgeItem(history=row["history"], lang=row["language"],
                               steps=[p.steps.get(j) or None for j in (1, 2, 3)],
                               reply=reply, reference=row["solution"],
                               candidate_first=bool(coin[k]), format_complete=p.complete,
                               images=judge_frames(row)))

    t = time.perf_counter()                                          # 4. UnifiReward
    results = ctrl.reward_model.scatter("score", items)
    timing["judge"] = time.perf_counter() - t
    rewards = np.array([r.reward for r in results], dtype=np.float64)

    red, final = redundancy(ctrl, batch_rows, replies, rewards, timing)   # 5. RUR
    verdicts = np.array([[v is True for v in r.step_verdicts] for r in results])
    asked = sum(r.asked for r in results)
    pref_ok = np.array([r.preference_ok is True for r in results])
    # the judge contradicting itself: every step sound but the reply worse than the reference,
    # or no step sound but the reply at least as good (PEER: fewer with one unified judge)
    split = (verdicts.all(axis=1) & ~pref_ok) | (~verdicts.any(axis=1) & pref_ok)
    metrics = {
        "reward/format_rate": float(np.mean([p.complete for p in parsed])),
        "reward/step1_true_rate": float(verdicts[:, 0].mean()),
        "reward/step2_true_rate": float(verdicts[:, 1].mean()),
        "reward/step3_true_rate": float(verdicts[:, 2].mean()),
        "reward/preference_ok_rate": float(pref_ok.mean()),
        "judge/inconsistency_rate": float(split.mean()),
        "judge/parse_failure_rate": sum(r.parse_failures for r in results) / max(asked, 1),
        "judge/asked": asked,
    }
    return ScoredBatch(samples=samples, parsed=parsed, replies=replies, rewards=rewards,
                       final=final, redundancy=red, metrics=metrics,
                       judge_raw=[r.raw for r in results])
