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

from peer_rl.evaluation.supporter import shown_reply, supporter_request
from peer_rl.metrics import distinct_n
from peer_rl.rewards import group_similarity, history_similarity


def diversity_case(prompt, style: str, n: int = 4, images: bool = True):
    texts = yield "model", supporter_request(style, list(prompt.history), prompt.language,
                                             images=prompt.images if images else (), n=n,
                                             messages=list(prompt.messages))
    shown = [shown_reply(t, style) for t in texts]
    return {"language": prompt.language, "model_raw": texts, "replies": [s for s, _ in shown],
            "step4": [ok for _, ok in shown],
            "history": [t["content"] for t in prompt.history]}


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
    step4 = [x for r in ok for x in r["step4"] if x is not None]
    out = {"protocol": "diversity", "cases": len(records), "errors": len(records) - len(ok),
           "error_ids": [r["id"] for r in records if "error" in r],
           "step4_rate": sum(step4) / len(step4) if step4 else None}
    out |= diversity_metrics([r["replies"] for r in ok], [r["history"] for r in ok], encode)
    by_lang = {}
    for lang in sorted({r["language"] for r in ok}):
        sub = [r for r in ok if r["language"] == lang]
        by_lang[lang] = diversity_metrics([r["replies"] for r in sub],
                                          [r["history"] for r in sub], encode)
    out["by_language"] = by_lang
    return out
