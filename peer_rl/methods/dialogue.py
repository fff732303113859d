"""Training on whole conversations (dialogue.enable): a step's stages 2-5 for a batch of seeker
profiles.

2. rollout: a first message for each profile that has none (an ESC-Eval role card: the seeker
   writes it, once for the profile's group); then rollout.n dialogues per profile between the
   policy (the rollout pool, asked once a turn for every dialogue still going) and the
   simulated seeker (the seeker pool, SAGE's analyser and reply),
   peer_rl.methods.dialogue_rollout;
3. each policy turn is parsed (Steps 1-4) and becomes a trained row (dialogue_turns);
4. UnifiReward judges each turn's steps against the dialogue so far, and its format (no
   reference reply, so no outcome round); the outcome is the seeker's final emotion / 100;
5. RUR per turn: the reply against its dialogue's earlier replies (history) and the group's
   replies at the same turn (in-group).

The advantages are the method's own (peer_rl.algos.turn_credit, `dialogue.credit`): a group is
rollout.n dialogues of unequal length, not rollout.n samples.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace

import numpy as np

from peer_rl.algos.emotion import EmotionRules, emotion_reward
from peer_rl.algos.rewards import rur_reweight
from peer_rl.algos.turn_credit import dialogue_advantages
from peer_rl.methods.base import Groups, Method, Settings, register
from peer_rl.methods.dialogue_rollout import SeekerProfile, dialogue, run_dialogues
from peer_rl.methods.dialogue_turns import (dialogue_metrics, per_dialogue, turn_histories,
                                            turn_judge_items, turn_peers, turn_samples)
from peer_rl.methods.peer import judge_metrics
from peer_rl.methods.scored_batch import ScoredBatch
from peer_rl.prompts.policy import PolicyTemplate
from peer_rl.prompts.seeker import seeker_line, seeker_messages
from peer_rl.protocol import Prompt, SamplingConfig, SeekerRequest, request_seed

# the judge metrics that compare with a reference reply, which a simulated dialogue lacks
_NO_REFERENCE = ("reward/preference_ok_rate", "judge/inconsistency_rate")


@dataclass(frozen=True)
class DialogueSettings:
    """dialogue.* as the method reads it."""
    max_turns: int
    credit: str
    turn_weight: float
    dialogue_weight: float
    rules: EmotionRules
    room: int        # a policy prompt's tokens at most: rollout.max_model_len - response_length

    @classmethod
    def from_config(cls, cfg) -> "DialogueSettings":
        d = cfg.dialogue
        return cls(d.max_turns, d.credit, d.turn_weight, d.dialogue_weight,
                   EmotionRules(start=d.emotion_start),
                   cfg.rollout.max_model_len - cfg.rollout.response_length)


def profile_of(row: dict) -> SeekerProfile:
    """A prompt row of a dialogue run (peer_rl.trainer.profile_rows) as the seeker's profile."""
    return SeekerProfile(row["id"], row["persona"], row["opening"], row["language"])


@register
class Dialogues(Method):
    name = "dialogue"

    def __init__(self, groups: Groups, settings: Settings, dialogue_settings: DialogueSettings,
                 template: PolicyTemplate | None = None):
        self.groups, self.settings, self.dialogue = groups, settings, dialogue_settings
        self.template = template or PolicyTemplate()

    @classmethod
    def pools(cls, cfg) -> set[str]:
        return super().pools(cfg) | {"seeker"}

    @classmethod
    def from_config(cls, groups: Groups, cfg) -> "Dialogues":
        return cls(groups, Settings.from_config(cfg), DialogueSettings.from_config(cfg))

    def _policy(self, step: int, n_dialogues: int):
        """The policy party: one sample per live dialogue, each request seeded by its round and
        its dialogue's place in the round (so a turn's seed never repeats another's). A prompt
        longer than `room` (counted by the rollout engines' own tokenizer) is not sent:
        its answer is None, and its dialogue ends there."""
        s = self.settings.sampling
        sampling = SamplingConfig(n=1, temperature=s.temperature, top_p=s.top_p,
                                  max_tokens=s.max_tokens, seed=s.seed)
        rounds = itertools.count()

        def ask(requests: list) -> list:
            r = next(rounds)
            prompts = [Prompt(uid=k, messages=m, seed=request_seed(
                self.settings.seed, step - 1, "rollout", r * n_dialogues + k, 1))
                for k, m in enumerate(requests)]
            lengths = self.groups.rollout.call("prompt_tokens", prompts, step=step)
            fits = [k for k, n in enumerate(lengths) if n <= self.dialogue.room]
            answers: list = [None] * len(prompts)
            if fits:
                done = self.groups.rollout.call("generate", [prompts[k] for k in fits],
                                                sampling, step=step)
                for k, sample in zip(fits, done):
                    answers[k] = sample
            return answers
        return ask

    def _seeker(self, step: int, n_dialogues: int):
        """The seeker party: SAGE's analyser (with its JSON schema) or reply per request. Its
        rounds count from 1: round 0's seeds are the openings'."""
        rounds = itertools.count(1)

        def ask(requests: list) -> list:
            r = next(rounds)
            asked = [SeekerRequest(m, schema, request_seed(
                self.settings.seed, step - 1, "seeker", r * n_dialogues + k, 1))
                for k, (m, schema) in enumerate(requests)]
            return self.groups.seeker.call("chat", asked, step=step)
        return ask

    def _profiles(self, rows: list[dict], step: int) -> list[SeekerProfile]:
        """Each row's seeker; one without a first message has the seeker write it, once for its
        group, so the group's dialogues start alike (seeded as the seeker's round 0)."""
        profiles = [profile_of(row) for row in rows]
        need = [k for k, p in enumerate(profiles) if p.opening is None]
        if not need:
            return profiles
        asked = [SeekerRequest(seeker_messages(profiles[k].persona, [], profiles[k].language),
                               None, request_seed(self.settings.seed, step - 1, "seeker", k, 1))
                 for k in need]
        for k, text in zip(need, self.groups.seeker.call("chat", asked, step=step)):
            profiles[k] = replace(profiles[k], opening=seeker_line(text))
        return profiles

    def score(self, rows: list[dict], step: int, timing, samples: list | None = None
              ) -> ScoredBatch:
        if samples is not None:
            raise ValueError("dialogue training draws its own turns; samples given ahead are "
                             "not supported")
        d, n = self.dialogue, self.settings.n
        t = time.perf_counter()                                           # 2. dialogues
        programs = [dialogue(uid, profile, self.template, d.max_turns, d.rules)
                    for uid, profile in enumerate(self._profiles(rows, step)) for _ in range(n)]
        dialogues = run_dialogues(programs, {"policy": self._policy(step, len(programs)),
                                             "seeker": self._seeker(step, len(programs))})
        timing["rollout"] = time.perf_counter() - t
        samples = turn_samples(dialogues)                                 # 3. turns
        parsed = [turn.parsed for x in dialogues for turn in x.turns]
        replies = [p.reply for p in parsed]

        t = time.perf_counter()                                           # 4. UnifiReward
        results = self.groups.reward_model.call("score", turn_judge_items(dialogues), step=step)
        timing["judge"] = time.perf_counter() - t
        rewards = np.array([r.reward for r in results], dtype=np.float64)

        t = time.perf_counter()                                           # 5. RUR
        similarities, reweighted = None, rewards
        if self.groups.redundancy is not None:
            similarities = self.groups.redundancy.call(
                "turn_similarities", replies, turn_histories(dialogues), turn_peers(dialogues),
                step=step)
            reweighted = rur_reweight(rewards, similarities.s_hist, similarities.s_group,
                                      similarities.tau)
        timing["redundancy"] = time.perf_counter() - t

        outcome = [emotion_reward(x.trajectory[-1]) for x in dialogues]
        advantages = np.concatenate(dialogue_advantages(
            per_dialogue(dialogues, reweighted), outcome, [x.uid for x in dialogues],
            d.credit, d.turn_weight, d.dialogue_weight))
        metrics = {k: v for k, v in judge_metrics(parsed, results).items()
                   if k not in _NO_REFERENCE}
        metrics |= dialogue_metrics(dialogues, reweighted)
        metrics["dialogue/reward_mean"] = float(np.mean(outcome))
        return ScoredBatch(samples=samples, parsed=parsed, replies=replies, rewards=rewards,
                           reweighted=reweighted, redundancy=similarities, metrics=metrics,
                           judge_raw=[r.raw for r in results], advantages=advantages,
                           dialogues=dialogues)
