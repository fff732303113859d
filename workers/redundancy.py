"""Redundancy pool (PEER-RUR): sentence embeddings -> s^hi, s^in, tau -> reweighted rewards.

A plain class; the placement layer makes it a Ray actor. The replies of a step and the history
utterances not seen before are encoded in one batched call; history embeddings are kept (by
text, least recently used dropped first), so a prompt's history is encoded once, not again for
each of its G replies or in later epochs. Similarities are matrix products (peer_rl.algos.rewards).
"""
from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np

from peer_rl.protocol import Dispatch, Similarities, dispatch
from peer_rl.algos.rewards import (count_words, group_similarity, history_similarity,
                                   length_coefficient, peer_similarity, rur_reweight)
from peer_rl.models.encoders import load_embedding_model
from peer_rl.tracking.metrics import peak_rss_bytes
from peer_rl.config.worker_settings import RedundancySettings
from peer_rl.workers import devices

class RedundancyWorker:
    def __init__(self, settings: RedundancySettings | None = None, device: str | None = None,
                 history_cache_size: int = 200_000):
        s = self.settings = settings or RedundancySettings()
        device = device or devices.device()
        self.model_name = s.embedding_model
        self.model = load_embedding_model(s.embedding_model, device, s.batch_size)
        self._history: OrderedDict[str, np.ndarray] = OrderedDict()
        self.history_cache_size = history_cache_size
        self.encoded = 0                 # texts sent to the model (a cache hit sends none)

    @dispatch(Dispatch.SHARD)
    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.model.dim), dtype=np.float32)
        self.encoded += len(texts)
        return self.model.encode(texts)

    def _encode_with_history(self, replies: list[str], history: list[str]):
        """(reply embeddings, history embeddings): one model call for the replies and the
        history utterances not cached yet."""
        new = list(dict.fromkeys(u for u in history if u not in self._history))
        emb = self.encode(list(replies) + new)
        for text, e in zip(new, emb[len(replies):]):
            self._history[text] = e
        hist = np.stack([self._history[u] for u in history]) if history \
            else np.zeros((0, emb.shape[1]), dtype=emb.dtype)
        for u in history:                                  # most recently used last
            self._history.move_to_end(u)
        while len(self._history) > self.history_cache_size:
            self._history.popitem(last=False)
        return emb[:len(replies)], hist

    @dispatch(Dispatch.ONE)
    def similarities(self, replies: list[str], histories: list[list[str]],
                     group_size: int) -> Similarities:
        """replies (B*G) grouped by prompt; histories (B) utterance lists -> s_hist, s_group, tau."""
        if len(replies) != len(histories) * group_size:
            raise ValueError(f"{len(replies)} replies for {len(histories)} prompts x G={group_size}")
        flat_hist = [u for h in histories for u in h]
        owner = np.repeat(np.arange(len(histories)), [len(h) for h in histories])
        rep_emb, hist_emb = self._encode_with_history(replies, flat_hist)
        reply_owner = np.repeat(np.arange(len(histories)), group_size)
        s = self.settings
        n_words = np.array([count_words(r, s.cjk_chars_per_word) for r in replies])
        return Similarities(
            s_hist=history_similarity(rep_emb, hist_emb, owner, reply_owner, s.history_agg),
            s_group=group_similarity(rep_emb, group_size, s.group_agg),
            tau=length_coefficient(n_words, s.alpha, s.beta), n_words=n_words)

    @dispatch(Dispatch.ONE)
    def turn_similarities(self, replies: list[str], histories: list[list[str]],
                          peers) -> Similarities:
        """Whole conversations (peer_rl.methods.dialogue_turns): each turn's reply against its
        own history (its dialogue's earlier replies) and against the replies sharing its peer
        id (the group's same turn, groups of any size)."""
        if len(replies) != len(histories) or len(replies) != len(peers):
            raise ValueError(f"{len(replies)} replies, {len(histories)} histories, "
                             f"{len(peers)} peer ids")
        flat_hist = [u for h in histories for u in h]
        owner = np.repeat(np.arange(len(histories)), [len(h) for h in histories])
        rep_emb, hist_emb = self._encode_with_history(replies, flat_hist)
        s = self.settings
        n_words = np.array([count_words(r, s.cjk_chars_per_word) for r in replies])
        return Similarities(
            s_hist=history_similarity(rep_emb, hist_emb, owner, np.arange(len(replies)),
                                      s.history_agg),
            s_group=peer_similarity(rep_emb, peers, s.group_agg),
            tau=length_coefficient(n_words, s.alpha, s.beta), n_words=n_words)

    def reweight(self, rewards, replies: list[str], histories: list[list[str]],
                 group_size: int) -> tuple[Similarities, np.ndarray]:
        sims = self.similarities(replies, histories, group_size)
        return sims, rur_reweight(rewards, sims.s_hist, sims.s_group, sims.tau)

    def health(self) -> dict:
        return {"model": self.model_name, "pid": os.getpid(), "peak_rss_bytes": peak_rss_bytes()}
