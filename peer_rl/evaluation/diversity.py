"""Diversity of a model's replies on the GRPO test prompts: the quantity RUR protects.

Each prompt is answered `n` times (sampled). Reported over the replies the seeker would read:
distinct-1/2 (unique n-grams / all n-grams, CJK characters as tokens), self-similarity (mean
cosine over all pairs of replies to different prompts: high when the model says the same thing
to everyone), within-prompt similarity (mean cosine among the n replies to one prompt: RUR's
s_group) and history similarity (max cosine of a reply to its prompt's history utterances: RUR's
s_hist). Embeddings come from the RUR embedding model.
"""
from __future__ import annotations

import numpy as np

from peer_rl.config.worker_settings import JudgeSettings
from peer_rl.evaluation.supporter import supporter_turn
from peer_rl.prompts.reasoning import parse_structured
from peer_rl.protocol import JudgeItem
from peer_rl.tracking.metrics import distinct_n
from peer_rl.algos.rewards import group_similarity, history_similarity


def diversity_case(prompt, style: str, n: int = 4, images: bool = True, rag_k: int = 0):
    turns = yield from supporter_turn(style, list(prompt.history), prompt.language, n=n,
                                      images=prompt.images if images else (),
                                      messages=list(prompt.messages), rag_k=rag_k)
    record = {"language": prompt.language, "model_raw": [t.raw for t in turns],
              "replies": [t.shown for t in turns], "format_ok": [t.format_ok for t in turns],
              "history": [t["content"] for t in prompt.history],
              "history_turns": [dict(t) for t in prompt.history],
              "solution": getattr(prompt, "solution", "")}
    if rag_k:
        record |= {"initial_raw": [t.initial_raw for t in turns],
                   "exemplars": [list(t.exemplars) for t in turns]}
    return record


def diversity_metrics(replies: list[list[str]], histories: list[list[str]], encode) -> dict:
    """replies[i]: the n replies to prompt i; encode(texts) -> unit rows (n_texts, d)."""
    flat = [r for group in replies for r in group]
    if not flat:
        return {}
    sizes = {len(g) for g in replies}
    owner = np.repeat(np.arange(len(replies)), [len(g) for g in replies])
    hist_flat = [h for hs in histories for h in hs]
    hist_owner = np.repeat(np.arange(len(histories)), [len(h) for h in histories])
    emb = np.asarray(encode(flat + hist_flat), dtype=np.float64)
    rep, hist = emb[:len(flat)], emb[len(flat):]
    sims = rep @ rep.T
    cross = owner[:, None] != owner[None, :]
    out = {"replies": len(flat), "prompts": len(replies),
           "distinct_1": distinct_n(flat, 1), "distinct_2": distinct_n(flat, 2),
           "self_similarity": float(sims[cross].mean()) if cross.any() else None,
           "history_similarity": float(history_similarity(rep, hist, hist_owner, owner).mean())}
    if len(sizes) == 1 and sizes.pop() > 1:
        out["within_prompt_similarity"] = float(group_similarity(rep, len(replies[0])).mean())
    return out


def summarise_diversity(records: list[dict], encode) -> dict:
    ok = [r for r in records if "error" not in r]
    fmt = [x for r in ok for x in r["format_ok"] if x is not None]
    out = {"protocol": "diversity", "cases": len(records), "errors": len(records) - len(ok),
           "error_ids": [r["id"] for r in records if "error" in r],
           "format_rate": sum(fmt) / len(fmt) if fmt else None}
    out |= diversity_metrics([r["replies"] for r in ok], [r["history"] for r in ok], encode)
    by_lang = {}
    for lang in sorted({r["language"] for r in ok}):
        sub = [r for r in ok if r["language"] == lang]
        by_lang[lang] = diversity_metrics([r["replies"] for r in sub],
                                          [r["history"] for r in sub], encode)
    out["by_language"] = by_lang
    return out


def judge_items(records: list[dict], seed: int = 0) -> list:
    """One JudgeItem per reply, built as training builds them (peer_rl.methods.peer): the
    whole history the policy was prompted with, the steps parsed from the raw reply, the row's
    solution as the reference, the candidate's round-4 position from a seeded coin."""
    rng = np.random.default_rng(seed)
    items = []
    for r in records:
        if "history_turns" not in r or not r.get("solution"):
            raise ValueError(f"diversity case {r.get('id')}: no history turns or solution on "
                             "record (a run stored before diversity.reward_model existed, or "
                             "a grpo row without `solution`); rerun it into a new --out")
        for raw in r["model_raw"]:
            p = parse_structured(raw)
            items.append(JudgeItem(history=list(r["history_turns"]),
                                   lang=r["language"],
                                   steps=[p.steps.get(j) or None for j in (1, 2, 3)],
                                   reply=p.reply, reference=r["solution"],
                                   candidate_first=bool(rng.random() < 0.5),
                                   format_complete=p.complete))
    return items


def judge_rewards(records: list[dict], reward_model: str, max_tokens: int = 8,
                  seed: int = 0) -> dict:
    """The training reward of every reply, from the UnifiReward judge at `reward_model`
    (in-process vLLM): its mean and spread, and the judge's verdict rates."""
    # deferred: tests patch UnifiRewardWorker
    from peer_rl.workers.unifireward import UnifiRewardWorker

    ok = [r for r in records if "error" not in r]
    items = judge_items(ok, seed=seed)
    worker = UnifiRewardWorker(reward_model, JudgeSettings(max_tokens=max_tokens), seed=seed)
    try:
        results = worker.score(items)
    finally:
        worker.close()
    rewards = np.array([x.reward for x in results], dtype=np.float64)
    steps = np.array([[v is True for v in x.step_verdicts] for x in results])
    return {"model": reward_model, "replies": len(results),
            "mean": float(rewards.mean()) if len(rewards) else None,
            "std": float(rewards.std()) if len(rewards) else None,
            "step_true_rate": [float(steps[:, k].mean()) for k in range(3)] if len(rewards) else [],
            "preference_ok_rate": (float(np.mean([x.preference_ok is True for x in results]))
                                   if len(results) else None),
            "parse_failures": int(sum(x.parse_failures for x in results))}
