"""The "retrieval" party of RAG inference: an exemplar index and its embedding model in this
process, behind the same batch call as the endpoints (`chat(queries) -> replies`, one Reply per
query whose texts are the exemplar replies, best first).

An exemplar whose history continues the case's (or that the case's continues) is never
returned: it comes from the same dialogue (peer_rl.retrieval.index.same_dialogue).

The query key is the one the training loop's retrieval pool uses (peer_rl.retrieval.index.
exemplar_key: the seeker's last turn and the initial reply), so inference retrieves as the
policy was trained to read.
"""
from __future__ import annotations

from pathlib import Path

from peer_rl.evaluation.endpoints import Reply
from peer_rl.retrieval.index import ExemplarIndex, Query, exemplar_key


class LocalRetriever:
    def __init__(self, index_dir: str | Path, embedding_model: str = ""):
        # deferred: tests patch load_embedding_model
        from peer_rl.models.encoders import load_embedding_model

        self.index = ExemplarIndex(index_dir, embedding_model=embedding_model or None)
        self.embedding_model = self.index.info["embedding_model"]
        self.encoder = load_embedding_model(self.embedding_model)
        self.name = f"retrieval ({index_dir}, {len(self.index.exemplars)} exemplars)"
        self.excluded = 0    # exemplars of a case's own dialogue passed over, all queries

    def chat(self, queries: list) -> list[Reply]:
        """queries: peer_rl.evaluation.supporter.Query (history, reply, k)."""
        if not queries:
            return []
        vecs = self.encoder.encode([exemplar_key(q.history, q.reply) for q in queries])
        res = self.index.search_vectors(vecs, max(q.k for q in queries),
                                        [Query(q.history, q.dialogue) for q in queries])
        self.excluded += sum(res.excluded)
        return [Reply(texts=[h.exemplar["response"] for h in row[:q.k]])
                for q, row in zip(queries, res.hits)]

    def close(self) -> None:
        pass
