"""Retrieval pool (ESCRAG-R1): holds the exemplar index and the embedding model, answers
batched queries. A plain class; the placement layer makes it a Ray actor.

One call embeds every query of a step at once and runs one faiss search; the controller sends
RetrievalQuery items (peer_rl.protocol) and gets k exemplars per query, best
first, none from the query's own dialogue (peer_rl.retrieval.index.same_dialogue).
"""
from __future__ import annotations

import os
import time

from peer_rl.protocol import Dispatch, RetrievalHits, RetrievalQuery, dispatch
from peer_rl.retrieval.index import ExemplarIndex, Query, exemplar_key
from peer_rl.tracking.metrics import peak_rss_bytes
from peer_rl.models.encoders import load_embedding_model
from peer_rl.workers import devices


class RetrievalWorker:
    def __init__(self, index_dir: str, embedding_model: str, device: str | None = None,
                 batch_size: int = 64):
        t0 = time.perf_counter()
        device = device or devices.device()
        # faiss on the GPUs of this worker's bundle only (Ray made just those visible)
        self.index = ExemplarIndex(index_dir, embedding_model=embedding_model,
                                   use_gpu=device == "cuda")
        self.encoder = load_embedding_model(embedding_model, device, batch_size)
        self.index_dir, self.embedding_model = index_dir, embedding_model
        self.start_seconds = time.perf_counter() - t0
        self.queries = 0

    @dispatch(Dispatch.SHARD)
    def search(self, queries: list[RetrievalQuery], k: int) -> RetrievalHits:
        """k exemplars per query, queried with the seeker's last turn and the initial reply;
        exemplars of the query's own dialogue are passed over (and counted)."""
        t0 = time.perf_counter()
        if not queries:
            return RetrievalHits([], [], 0.0, [os.getpid()])
        vecs = self.encoder.encode([exemplar_key(q.history, q.reply) for q in queries])
        res = self.index.search_vectors(vecs, k, [Query(q.dialogue_history or q.history,
                                                        q.dialogue) for q in queries])
        self.queries += len(queries)
        return RetrievalHits([[{"score": h.score, **h.exemplar} for h in row] for row in res.hits],
                             list(res.excluded), time.perf_counter() - t0, [os.getpid()])

    def health(self) -> dict:
        return {"ok": True, "pid": os.getpid(), "index": self.index_dir,
                "exemplars": len(self.index.exemplars), "kind": self.index.info["kind"],
                "embedding_model": self.embedding_model, "queries": self.queries,
                "start_seconds": round(self.start_seconds, 2), "peak_rss_bytes": peak_rss_bytes()}
