"""ESCRAG-R1's stages 2-5: two-pass rollouts with retrieval, scored by the scalar reward model.

With `retrieval.enable=false` (the paper's "Vanilla-GRPO" rung) the same prompt and reward run
one pass: the G initial replies are the GRPO samples.

Per prompt the rollout pool writes G initial replies (the therapist prompt, reasoning in
<think></think>); the retrieval pool returns `retrieval.k` exemplars for each (queried with the
seeker's last turn and the initial reply); the rollout pool then writes one final reply per
initial one, conditioned on the dialogue, that initial reply and its exemplars. The reward pool
scores both passes' replies (the initial scores are a metric: what retrieval adds); the final
replies are the GRPO samples, each with its own full prompt, grouped by the prompt they answer.
With `retrieval.train_initial` the initial replies join the batch as groups of their own.
"""
from __future__ import annotations

import time

import numpy as np

from peer_rl.escrag_prompt import final_messages, initial_messages, parse_reasoned
from peer_rl.protocol import Prompt, shard
from peer_rl.stages import generate, redundancy
from peer_rl.step_batch import ScoredBatch


def _rewards(ctrl, items: list[tuple]) -> np.ndarray:
    return np.array(ctrl.reward_model.scatter("score", items), dtype=np.float64)


def score_escrag(ctrl, batch_rows: list[dict], timing) -> ScoredBatch:
    """Two passes with retrieval (`retrieval.enable`), else one pass (Vanilla-GRPO)."""
    cfg, G = ctrl.cfg, ctrl.G
    B = len(batch_rows)
    t = time.perf_counter()                                           # pass 1
    initial = generate(ctrl, [Prompt(uid=i, messages=initial_messages(r["history"],
                                                                       r["language"]))
                               for i, r in enumerate(batch_rows)], G, "rollout")
    timing["rollout"] = time.perf_counter() - t
    if len(initial) != B * G:
        raise RuntimeError(f"rollout returned {len(initial)} initial samples for {B} x n={G}")
    init_parsed = [parse_reasoned(s.text) for s in initial]
    if not cfg.retrieval.enable:
        t = time.perf_counter()
        rewards = _rewards(ctrl, [(batch_rows[s.uid]["history"], p.reply,
                                   batch_rows[s.uid]["language"])
                                  for s, p in zip(initial, init_parsed)])
        timing["judge"] = time.perf_counter() - t
        replies = [p.reply for p in init_parsed]
        red, final = redundancy(ctrl, batch_rows, replies, rewards, timing)
        return ScoredBatch(samples=initial, parsed=init_parsed, replies=replies,
                           rewards=rewards, final=final, redundancy=red,
                           metrics={"reward/format_rate": float(np.mean([p.complete
                                                                         for p in init_parsed]))},
                           judge_raw=[None] * len(initial))

    t = time.perf_counter()                                           # retrieval
    queries = [(batch_rows[s.uid]["history"], p.reply, batch_rows[s.uid].get("dialogue"))
               for s, p in zip(initial, init_parsed)]
    parts = ctrl.retrieval.map("search", shard(queries, len(ctrl.retrieval)), cfg.retrieval.k)
    hits = [h for part in parts for h in part["hits"]]
    excluded = [n for part in parts for n in part["excluded"]]
    search_s = sum(part["seconds"] for part in parts)
    timing["retrieval"] = time.perf_counter() - t

    t = time.perf_counter()                                           # pass 2
    finals = generate(ctrl, [Prompt(uid=s.uid, messages=final_messages(
        batch_rows[s.uid]["history"], batch_rows[s.uid]["language"], p.reply,
        [e["response"] for e in hs])) for s, p, hs in zip(initial, init_parsed, hits)], 1,
        "rollout_final")
    timing["rollout_final"] = time.perf_counter() - t
    parsed = [parse_reasoned(s.text) for s in finals]
    replies = [p.reply for p in parsed]

    t = time.perf_counter()                                           # scalar reward, both passes
    items = [(batch_rows[s.uid]["history"], p.reply, batch_rows[s.uid]["language"])
             for s, p in zip(finals + initial, parsed + init_parsed)]
    scores = _rewards(ctrl, items)
    rewards, init_rewards = scores[:B * G], scores[B * G:]
    timing["judge"] = time.perf_counter() - t
    red, final = redundancy(ctrl, batch_rows, replies, rewards, timing)

    metrics = {
        "reward/format_rate": float(np.mean([p.complete for p in parsed])),
        "reward/initial_format_rate": float(np.mean([p.complete for p in init_parsed])),
        "reward/initial_mean": float(init_rewards.mean()),
        "reward/final_mean": float(rewards.mean()),
        "reward/final_minus_initial": float((rewards - init_rewards).mean()),
        "retrieval/search_seconds": search_s,
        "retrieval/top_score_mean": float(np.mean([hs[0]["score"] for hs in hits if hs])),
        "retrieval/exemplars_per_query": float(np.mean([len(hs) for hs in hits])),
        # exemplars of the prompt's own dialogue passed over (never shown to the policy)
        "retrieval/excluded_per_query": float(np.mean(excluded)),
    }
    samples, all_rewards, all_final, all_replies = finals, rewards, final, replies
    if cfg.retrieval.train_initial:   # initial replies as groups of their own (uid + B)
        for s in initial:
            s.uid += B
        samples = finals + initial
        all_rewards = np.concatenate([rewards, init_rewards])
        all_final = np.concatenate([final, init_rewards])
        all_replies = replies + [p.reply for p in init_parsed]
    return ScoredBatch(samples=samples, parsed=parsed, replies=all_replies,
                       rewards=all_rewards, final=all_final, redundancy=red, metrics=metrics,
                       judge_raw=[None] * len(samples))

