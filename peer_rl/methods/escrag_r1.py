"""ESCRAG-R1's stages 2-5: two-pass rollouts with retrieval, scored by the scalar reward model.

With `retrieval.enable=false` (the paper's "Vanilla-GRPO" rung) the same prompt and reward run
one pass: the G initial replies are the GRPO samples.

Per prompt the rollout pool writes G initial replies (the therapist prompt, reasoning in
<think></think>); the retrieval pool returns `retrieval.k` exemplars for each (queried with the
seeker's last turn and the initial reply); the rollout pool then writes one refined reply
(pass 2) per initial one, conditioned on the dialogue, that initial reply and its exemplars. The
reward pool scores both passes' replies (the initial scores are a metric: what retrieval adds);
the refined replies are the GRPO samples, each with its own full prompt, grouped by the prompt
they answer.
With `retrieval.train_initial` the initial replies join the batch as groups of their own.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from peer_rl.prompts.escrag import initial_messages, parse_reasoned, refined_messages
from peer_rl.methods.base import Groups, Method, Settings, register
from peer_rl.methods.common import generate, reweight
from peer_rl.protocol import Prompt, RetrievalQuery, ScalarItem
from peer_rl.methods.scored_batch import ScoredBatch


@dataclasses.dataclass(frozen=True)
class RetrievalSettings:
    enable: bool          # retrieval.enable: two passes with exemplars (else Vanilla-GRPO)
    k: int                # retrieval.k: exemplars per initial reply
    train_initial: bool   # retrieval.train_initial: initial replies as groups of their own


def retrieval_queries(rows: list[dict], initial: list, parsed: list) -> list[RetrievalQuery]:
    """One query per initial reply: the history the policy was shown, the reply, and the
    prompt's dialogue identity (its `dialogue` id and whole dialogue before any cut,
    peer_rl.data.history) so that none of its own dialogue's exemplars come back."""
    return [RetrievalQuery(rows[s.uid]["history"], p.reply, rows[s.uid].get("dialogue"),
                           rows[s.uid].get("dialogue_history"))
            for s, p in zip(initial, parsed)]


@register
class EscragR1(Method):
    name = "escrag_r1"

    def __init__(self, groups: Groups, settings: Settings, retrieval: RetrievalSettings):
        self.groups, self.settings, self.retrieval = groups, settings, retrieval

    @classmethod
    def pools(cls, cfg) -> set[str]:
        return super().pools(cfg) | ({"retrieval"} if cfg.retrieval.enable else set())

    @classmethod
    def from_config(cls, groups: Groups, cfg) -> "EscragR1":
        r = cfg.retrieval
        return cls(groups, Settings.from_config(cfg),
                   RetrievalSettings(enable=r.enable, k=r.k, train_initial=r.train_initial))

    def _rewards(self, rows: list[dict], samples: list, parsed: list, step: int) -> np.ndarray:
        items = [ScalarItem(rows[s.uid]["history"], p.reply, rows[s.uid]["language"])
                 for s, p in zip(samples, parsed)]
        return np.array(self.groups.reward_model.call("score", items, step=step),
                        dtype=np.float64)

    def score(self, rows: list[dict], step: int, timing, samples: list | None = None
              ) -> ScoredBatch:
        if samples is not None:
            raise ValueError("escrag_r1 generates both passes itself: samples cannot be given")
        n, B = self.settings.n, len(rows)
        t = time.perf_counter()                                           # pass 1
        initial = generate(self.groups.rollout,
                           [Prompt(uid=i, messages=initial_messages(r["history"], r["language"]))
                            for i, r in enumerate(rows)], self.settings.sampling, step)
        timing["rollout"] = time.perf_counter() - t
        init_parsed = [parse_reasoned(s.text) for s in initial]
        if not self.retrieval.enable:
            return self._one_pass(rows, step, timing, initial, init_parsed)

        t = time.perf_counter()                                           # retrieval
        found = self.groups.retrieval.call("search", retrieval_queries(rows, initial, init_parsed),
                                           self.retrieval.k, step=step)
        hits, excluded, search_s = found.hits, found.excluded, found.seconds
        timing["retrieval"] = time.perf_counter() - t

        t = time.perf_counter()                                           # pass 2
        refined = generate(self.groups.rollout, [Prompt(uid=s.uid, messages=refined_messages(
            rows[s.uid]["history"], rows[s.uid]["language"], p.reply,
            [e["response"] for e in hs])) for s, p, hs in zip(initial, init_parsed, hits)],
            dataclasses.replace(self.settings.sampling, n=1), step, "rollout_refined")
        timing["rollout_refined"] = time.perf_counter() - t
        parsed = [parse_reasoned(s.text) for s in refined]
        replies = [p.reply for p in parsed]

        t = time.perf_counter()                                    # scalar reward, both passes
        scores = self._rewards(rows, refined + initial, parsed + init_parsed, step)
        rewards, init_rewards = scores[:B * n], scores[B * n:]
        timing["judge"] = time.perf_counter() - t
        redundancy, reweighted = reweight(self.groups.redundancy, rows, replies, rewards, n, step,
                                          timing)

        metrics = {
            "reward/format_rate": float(np.mean([p.complete for p in parsed])),
            "reward/initial_format_rate": float(np.mean([p.complete for p in init_parsed])),
            "reward/initial_mean": float(init_rewards.mean()),
            "reward/refined_mean": float(rewards.mean()),
            "reward/refined_minus_initial": float((rewards - init_rewards).mean()),
            "retrieval/search_seconds": search_s,
            "retrieval/top_score_mean": float(np.mean([hs[0]["score"] for hs in hits if hs])),
            "retrieval/exemplars_per_query": float(np.mean([len(hs) for hs in hits])),
            # exemplars of the prompt's own dialogue passed over (never shown to the policy)
            "retrieval/excluded_per_query": float(np.mean(excluded)),
        }
        if not self.retrieval.train_initial:
            return ScoredBatch(samples=refined, parsed=parsed, replies=replies, rewards=rewards,
                               reweighted=reweighted, redundancy=redundancy, metrics=metrics,
                               judge_raw=[None] * len(refined))
        for s in initial:      # initial replies as groups of their own (uid + B)
            s.uid += B
        samples = refined + initial
        return ScoredBatch(samples=samples, parsed=parsed, replies=replies +
                           [p.reply for p in init_parsed],
                           rewards=np.concatenate([rewards, init_rewards]),
                           reweighted=np.concatenate([reweighted, init_rewards]),
                           redundancy=redundancy,
                           metrics=metrics, judge_raw=[None] * len(samples))

    def _one_pass(self, rows, step, timing, initial, parsed) -> ScoredBatch:
        """Vanilla-GRPO: the initial replies are the samples."""
        t = time.perf_counter()
        rewards = self._rewards(rows, initial, parsed, step)
        timing["judge"] = time.perf_counter() - t
        replies = [p.reply for p in parsed]
        redundancy, reweighted = reweight(self.groups.redundancy, rows, replies, rewards,
                                          self.settings.n, step, timing)
        return ScoredBatch(samples=initial, parsed=parsed, replies=replies, rewards=rewards,
                           reweighted=reweighted, redundancy=redundancy,
                           metrics={"reward/format_rate":
                                    float(np.mean([p.complete for p in parsed]))},
                           judge_raw=[None] * len(initial))
