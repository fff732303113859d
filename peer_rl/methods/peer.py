"""PEER's stages 2-5: G samples per prompt, their reasoning parsed, UnifiReward's four rounds
(or the PRM + ORM pair) and, for PEER-RUR, the redundancy reweighting.

Which candidate the judge sees first is a seeded coin per sample (the run seed and the step),
so the judge's position bias averages out and a rerun asks the same way."""
from __future__ import annotations

import time

import numpy as np

from peer_rl.methods.base import Groups, Method, Settings, register
from peer_rl.methods.common import generate, reweight
from peer_rl.protocol import JudgeItem, Prompt
from peer_rl.prompts.reasoning import parse_structured
from peer_rl.methods.scored_batch import ScoredBatch, judge_frames


@register
class Peer(Method):
    name = "peer"

    def __init__(self, groups: Groups, settings: Settings):
        self.groups, self.settings = groups, settings

    @classmethod
    def from_config(cls, groups: Groups, cfg) -> "Peer":
        return cls(groups, Settings.from_config(cfg))

    def rollout(self, rows: list[dict], step: int, timing) -> list:
        """Stage 2: G samples per prompt."""
        prompts = [Prompt(uid=i, messages=r["messages"], images=list(r.get("images") or []))
                   for i, r in enumerate(rows)]
        t = time.perf_counter()
        samples = generate(self.groups.rollout, prompts, self.settings.sampling, step)
        timing["rollout"] = time.perf_counter() - t
        return samples

    def judge_items(self, rows: list[dict], samples: list, parsed: list, replies: list[str],
                    step: int) -> list[JudgeItem]:
        coin = np.random.default_rng([self.settings.seed, step - 1]).random(len(samples)) < 0.5
        items = []
        for k, (s, p, reply) in enumerate(zip(samples, parsed, replies)):
            row = rows[s.uid]
            items.append(JudgeItem(history=row["history"], lang=row["language"],
                                   steps=[p.steps.get(j) or None for j in (1, 2, 3)],
                                   reply=reply, reference=row["solution"],
                                   candidate_first=bool(coin[k]), format_complete=p.complete,
                                   images=judge_frames(row)))
        return items

    def score(self, rows: list[dict], step: int, timing, samples: list | None = None
              ) -> ScoredBatch:
        if samples is None:
            samples = self.rollout(rows, step, timing)
        parsed = [parse_structured(s.text) for s in samples]              # 3. parse + format
        replies = [p.reply for p in parsed]
        items = self.judge_items(rows, samples, parsed, replies, step)

        t = time.perf_counter()                                           # 4. UnifiReward
        results = self.groups.reward_model.call("score", items, step=step)
        timing["judge"] = time.perf_counter() - t
        rewards = np.array([r.reward for r in results], dtype=np.float64)

        redundancy, reweighted = reweight(self.groups.redundancy, rows, replies,  # 5. RUR
                                          rewards, self.settings.n, step, timing)
        return ScoredBatch(samples=samples, parsed=parsed, replies=replies, rewards=rewards,
                           reweighted=reweighted, redundancy=redundancy,
                           metrics=judge_metrics(parsed, results),
                           judge_raw=[r.raw for r in results])


def judge_metrics(parsed: list, results: list) -> dict:
    """Format rate, each step's verdict rate, the judge's parse failures and its
    self-contradictions (every step sound but the reply worse than the reference, or no step
    sound but the reply at least as good: PEER reports fewer with one unified judge)."""
    verdicts = np.array([[v is True for v in r.step_verdicts] for r in results])
    asked = sum(r.asked for r in results)
    pref_ok = np.array([r.preference_ok is True for r in results])
    split = (verdicts.all(axis=1) & ~pref_ok) | (~verdicts.any(axis=1) & pref_ok)
    return {
        "reward/format_rate": float(np.mean([p.complete for p in parsed])),
        "reward/step1_true_rate": float(verdicts[:, 0].mean()),
        "reward/step2_true_rate": float(verdicts[:, 1].mean()),
        "reward/step3_true_rate": float(verdicts[:, 2].mean()),
        "reward/preference_ok_rate": float(pref_ok.mean()),
        "judge/inconsistency_rate": float(split.mean()),
        "judge/parse_failure_rate": sum(r.parse_failures for r in results) / max(asked, 1),
        "judge/asked": asked,
    }
