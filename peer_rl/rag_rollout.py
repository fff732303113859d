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
from peer_rl.protocol import Prompt, SamplingConfig, seeded, shard
from peer_rl.rewards import rur_reweight


def _generate(ctrl, prompts: list[Prompt], n: int, stream: str) -> list:
    cfg = ctrl.cfg
    seeded(prompts, cfg.trainer.seed, ctrl.scoring_step, stream, n)
    sampling = SamplingConfig(n=n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                              max_tokens=cfg.rollout.response_length, seed=cfg.trainer.seed)
    parts = ctrl._map_pool("rollout", "generate", shard(prompts, len(ctrl.pools.rollout)),
                           sampling)
    return [s for part in parts for s in part]


def _rewards(ctrl, items: list[tuple]) -> np.ndarray:
    parts = ctrl._map_pool("reward_model", "score", shard(items, len(ctrl.pools.reward_model)))
    return np.array([x for part in parts for x in part], dtype=np.float64)


def score_escrag(ctrl, batch_rows: list[dict], timing: dict) -> dict:
    """Two passes with retrieval (`retrieval.enable`), else one pass (Vanilla-GRPO)."""
    cfg, G = ctrl.cfg, ctrl.G
    B = len(batch_rows)
    t = time.perf_counter()                                           # pass 1
    initial = _generate(ctrl, [Prompt(uid=i, messages=initial_messages(r["history"],
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
        red, final = _rur(ctrl, batch_rows, replies, rewards, timing)
        return {"samples": initial, "parsed": init_parsed, "replies": replies,
                "rewards": rewards, "final": final, "redundancy": red,
                "metrics": {"reward/format_rate": float(np.mean([p.complete
                                                                 for p in init_parsed]))},
                "judge_raw": [None] * len(initial)}

    t = time.perf_counter()                                           # retrieval
    queries = [(batch_rows[s.uid]["history"], p.reply) for s, p in zip(initial, init_parsed)]
    parts = ctrl._map_pool("retrieval", "search", shard(queries, len(ctrl.pools.retrieval)),
                           cfg.retrieval.k)
    hits = [h for part in parts for h in part["hits"]]
    search_s = sum(part["seconds"] for part in parts)
    timing["retrieval"] = time.perf_counter() - t

    t = time.perf_counter()                                           # pass 2
    finals = _generate(ctrl, [Prompt(uid=s.uid, messages=final_messages(
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
    red, final = _rur(ctrl, batch_rows, replies, rewards, timing)

    metrics = {
        "reward/format_rate": float(np.mean([p.complete for p in parsed])),
        "reward/initial_format_rate": float(np.mean([p.complete for p in init_parsed])),
        "reward/initial_mean": float(init_rewards.mean()),
        "reward/final_mean": float(rewards.mean()),
        "reward/final_minus_initial": float((rewards - init_rewards).mean()),
        "retrieval/search_seconds": search_s,
        "retrieval/top_score_mean": float(np.mean([hs[0]["score"] for hs in hits if hs])),
        "retrieval/exemplars_per_query": float(np.mean([len(hs) for hs in hits])),
    }
    samples, all_rewards, all_final, all_replies = finals, rewards, final, replies
    if cfg.retrieval.train_initial:   # initial replies as groups of their own (uid + B)
        for s in initial:
            s.uid += B
        samples = finals + initial
        all_rewards = np.concatenate([rewards, init_rewards])
        all_final = np.concatenate([final, init_rewards])
        all_replies = replies + [p.reply for p in init_parsed]
    return {"samples": samples, "parsed": parsed, "replies": all_replies,
            "rewards": all_rewards, "final": all_final, "redundancy": red, "metrics": metrics,
            "judge_raw": [None] * len(samples)}


def _rur(ctrl, batch_rows: list[dict], replies: list[str], rewards: np.ndarray,
         timing: dict) -> tuple[dict | None, np.ndarray]:
    """RUR on the scored replies when `algorithm.rur.enable` (combinable with the scalar RM)."""
    t = time.perf_counter()
    red, final = None, rewards
    if ctrl.cfg.algorithm.rur.enable:
        histories = [[u["content"] for u in r["history"]] for r in batch_rows]
        red = ctrl._map_pool("redundancy", "similarities", [replies], histories, ctrl.G)[0]
        final = rur_reweight(rewards, red["s_hist"], red["s_group"], red["tau"])
    timing["redundancy"] = time.perf_counter() - t
    return red, final
