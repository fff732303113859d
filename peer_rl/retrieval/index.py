"""The ESCRAG-R1 exemplar index: preferred counsellor replies, keyed by their dialogue state, in
faiss.

An exemplar's key is the last seeker turn it answers plus the reply itself; a query is the last
seeker turn plus the policy's initial reply (the paper: "an initial response queries the
retrieval corpus"), so a hit is a preferred reply to a similar moment that says something like
what the policy was about to say. Vectors are unit-normalised, so inner product is cosine.
Exact search (`IndexFlatIP`) up to `approx_threshold` vectors, HNSW above it (no training
pass, good recall); on a machine with faiss-gpu and a GPU the flat index is moved to the GPUs.

An exemplar from the query's own dialogue is never returned for it (`same_dialogue`): the same
`dialogue` id where both sides carry one, or histories one of which continues the other (an
exemplar of this very turn, an earlier one, or a later one that already holds this turn's
reply). Otherwise a GRPO prompt whose dialogue is also in the corpus would be handed the reply
it is scored against, and learn to lean on hits it will not get at test time. The search
fetches more neighbours until k remain and reports how many it excluded.

A directory holds `index.faiss`, `exemplars.jsonl` (metadata, in vector order) and
`index.json` (embedding model, dimension, count, kind, the source's sha256 and its rows per
split). Loading with another embedding model is refused: its vectors would live in a different
space.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from peer_rl.data.dialogues import turn_keys
from peer_rl.files.out_paths import LOCK_FILE, MARKER, read_json, read_marker, staged_dir

INDEX_FILE, META_FILE, INFO_FILE = "index.faiss", "exemplars.jsonl", "index.json"
INDEX_FILES = (INDEX_FILE, META_FILE, INFO_FILE)
APPROX_THRESHOLD = 50_000


class IndexMismatch(ValueError):
    pass


def exemplar_key(history: list[dict], reply: str) -> str:
    """The text embedded for an exemplar (and, with the initial reply, for a query)."""
    last = next((t["content"] for t in reversed(history) if t["role"] == "seeker"), "")
    return f"{last}\n{reply}".strip()


def same_dialogue(exemplar_turns: tuple[str, ...], exemplar_dialogue: str | None,
                  query_turns: tuple[str, ...], query_dialogue: str | None) -> bool:
    """Whether an exemplar comes from the query's dialogue (see the module docstring)."""
    if exemplar_dialogue and query_dialogue:
        return exemplar_dialogue == query_dialogue
    n = min(len(exemplar_turns), len(query_turns))
    return n > 0 and exemplar_turns[:n] == query_turns[:n]


@dataclass
class Hit:
    score: float
    exemplar: dict


@dataclass
class Query:
    """What the index is asked: the dialogue so far (for exclusion), its id where known, and
    the text embedded (exemplar_key of the history and the initial reply)."""
    history: list[dict]
    dialogue: str | None = None


@dataclass
class SearchResult:
    hits: list[list[Hit]]
    excluded: list[int]          # per query: exemplars of its own dialogue passed over


def _faiss():
    try:
        import faiss  # deferred: optional, peer-rl[cpu]/[gpu] (faiss)
    except ImportError as exc:
        raise RuntimeError("the exemplar index needs faiss (pip install faiss-cpu, or "
                           "faiss-gpu-cu12 on GPU nodes)") from exc
    return faiss


class IndexDirError(ValueError):
    """An output directory that holds something other than an index: never replaced."""


def check_replaceable(out_dir: str | Path) -> None:
    """`out_dir` may be (re)written as an index: absent, empty, or an index directory (only the
    index's own files, index.json among them: a data root's `exemplars/` holding just an
    `exemplars.jsonl` is not one). Anything else (a data root, a home directory) is refused,
    untouched."""
    p = Path(out_dir)
    if not p.exists() and not p.is_symlink():
        return
    if p.is_symlink() or not p.is_dir():
        raise IndexDirError(f"{p}: exists and is not a directory; choose another --out")
    if read_marker(p).get("command") == "index build":    # its own earlier output
        return
    names = {x.name for x in p.iterdir()} - {MARKER, LOCK_FILE}
    extra = sorted(names - set(INDEX_FILES)) or sorted(names if INFO_FILE not in names else ())
    if extra:
        raise IndexDirError(f"{p}: holds {extra[:5]}{' ...' if len(extra) > 5 else ''}, "
                            f"not an exemplar index ({', '.join(INDEX_FILES)}); it is left "
                            "as it is: choose an empty or new --out")


def build_index(exemplars: list[dict], encode, embedding_model: str, out_dir: str | Path,
                approx_threshold: int = APPROX_THRESHOLD, source_sha256: str = "",
                batch_size: int = 256, progress=None, marker: str = "",
                source_splits: dict | None = None) -> dict:
    """Embed every exemplar (`encode(texts)` -> unit rows) and write the index directory
    whole (a directory made beside it, swapped in by peer_rl.files.out_paths.staged_dir: files
    of an earlier index that it did not write stay). `marker`: the command whose output it is
    (peer_rl.files.out_paths); `source_splits`: rows per split of the source files, recorded in
    index.json. Returns index.json's content."""
    faiss = _faiss()
    if not exemplars:
        raise ValueError("no exemplars to index")
    out = Path(out_dir)
    check_replaceable(out)            # before any embedding: a refused --out costs nothing
    keys = [exemplar_key(e["history"], e["response"]) for e in exemplars]
    chunks = []
    for start in range(0, len(keys), batch_size):
        chunks.append(np.asarray(encode(keys[start:start + batch_size]), dtype=np.float32))
        if progress is not None:
            progress(min(start + batch_size, len(keys)), len(keys))
    vecs = np.ascontiguousarray(np.concatenate(chunks))
    faiss.normalize_L2(vecs)
    dim = vecs.shape[1]
    if len(vecs) > approx_threshold:
        index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        kind = "hnsw"
    else:
        index = faiss.IndexFlatIP(dim)
        kind = "flat"
    index.add(vecs)
    info = {"embedding_model": embedding_model, "dim": int(dim), "count": len(exemplars),
            "kind": kind, "key": "last seeker turn + reply", "source_sha256": source_sha256,
            **({"splits": dict(source_splits)} if source_splits is not None else {}),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    with staged_dir(out, command=marker) as tmp:   # the old index stays whole until this is in
        faiss.write_index(index, str(tmp / INDEX_FILE))
        with open(tmp / META_FILE, "w", encoding="utf-8") as fh:
            for e in exemplars:
                fh.write(json.dumps(e, ensure_ascii=False) + "\n")
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=1), encoding="utf-8")
    return info


class ExemplarIndex:
    """A loaded index: `search(queries, k)` -> k hits per query, best first."""

    def __init__(self, directory: str | Path, embedding_model: str | None = None,
                 use_gpu: bool | None = None):
        faiss = _faiss()
        d = Path(directory)
        for name in (INDEX_FILE, META_FILE, INFO_FILE):
            if not (d / name).is_file():
                raise FileNotFoundError(f"{d}: no {name} (build one with `peer-rl index build "
                                        f"DATA --out {d}`)")

        self.info = read_json(d / INFO_FILE, "index info")
        if embedding_model is not None and embedding_model != self.info["embedding_model"]:
            raise IndexMismatch(
                f"{d} was built with embedding model {self.info['embedding_model']!r}; this run "
                f"embeds queries with {embedding_model!r}, whose vectors are not comparable. "
                f"Use the same model or rebuild the index with it.")
        self.index = faiss.read_index(str(d / INDEX_FILE))
        if self.index.ntotal != self.info["count"]:
            raise IndexMismatch(f"{d}: {INDEX_FILE} holds {self.index.ntotal} vectors, "
                                f"{INFO_FILE} says {self.info['count']}")
        if isinstance(self.index, faiss.IndexHNSWFlat):
            self.index.hnsw.efSearch = 64
        gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
        if (use_gpu if use_gpu is not None else gpus > 0) and gpus and self.info["kind"] == "flat":
            self.index = faiss.index_cpu_to_all_gpus(self.index)
        with open(d / META_FILE, encoding="utf-8") as fh:
            self.exemplars = [json.loads(line) for line in fh if line.strip()]
        if len(self.exemplars) != self.info["count"]:
            raise IndexMismatch(f"{d}: {META_FILE} has {len(self.exemplars)} exemplars for "
                                f"{self.info['count']} vectors")
        self._turns = [turn_keys(e["history"]) for e in self.exemplars]

    def search_vectors(self, vectors: np.ndarray, k: int,
                       queries: list[Query] | None = None) -> SearchResult:
        """k hits per query vector, best first; with `queries`, none from the query's own
        dialogue (neighbours are fetched in growing numbers until k survive)."""
        faiss = _faiss()
        q = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
        faiss.normalize_L2(q)
        n = len(self.exemplars)
        k = min(k, n)
        if queries is not None and len(queries) != len(q):
            raise ValueError(f"{len(queries)} queries for {len(q)} vectors")
        keys = [None if queries is None else turn_keys(x.history) for x in (queries or q)]
        hits: list[list[Hit] | None] = [None] * len(q)
        excluded = [0] * len(q)
        todo, fetch = list(range(len(q))), k
        while todo:
            scores, ids = self.index.search(q[todo], min(fetch, n))
            left = []
            for row, (row_s, row_i) in zip(todo, zip(scores, ids)):
                kept, dropped = [], 0
                for sc, i in zip(row_s, row_i):
                    if i < 0:
                        continue
                    if queries is not None and same_dialogue(
                            self._turns[i], self.exemplars[i].get("dialogue"), keys[row],
                            queries[row].dialogue):
                        dropped += 1
                        continue
                    kept.append(Hit(float(sc), self.exemplars[i]))
                if len(kept) >= k or fetch >= n:
                    hits[row], excluded[row] = kept[:k], dropped
                else:
                    left.append(row)
            todo, fetch = left, fetch * 4
        return SearchResult(hits=hits, excluded=excluded)
