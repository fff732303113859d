"""`peer-rl data personas ROOT --out DIR`: a DISC persona per seeker, clustered with K-Means.

Each seeker of the SER train files (their rows grouped by dialogue, peer_rl.datajobs.seekers;
the rows of a shared opening are a seeker of their own, counted as `ambiguous_rows`) gets DISC
ratings and a description of how they talk from the writer party. The descriptions are embedded
(the RUR embedding model by default) and clustered per language with scikit-learn's KMeans; k
is `personas.k`, or the k in [2, k_max] with the best silhouette, and is recorded with every
candidate's score. DIR holds `personas.jsonl` (seeker, language, DISC, description, cluster),
`clusters.json`, the run store and the report; `data rewrite` reads it.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from peer_rl.data.personas import PERSONAS_FILE
from peer_rl.datajobs import job
from peer_rl.datajobs.parse import parse_persona
from peer_rl.datajobs.prompts import DISC, PERSONA_SCHEMA, persona_messages
from peer_rl.datajobs.rows import load_rows
from peer_rl.datajobs.seekers import Seeker, group_seekers
from peer_rl.evaluation.endpoints import Request
from peer_rl.evaluation.store import RunStore
from peer_rl.files.out_paths import claim_dir, mark_dir, write_atomic

CLUSTERS_FILE = "clusters.json"


@dataclass(frozen=True)
class SeekerCase:
    id: str
    seeker: Seeker


def persona_case(case: SeekerCase):
    s = case.seeker
    raw = (yield "writer", Request(persona_messages(s.utterances, s.language),
                                   schema=PERSONA_SCHEMA))[0]
    p = parse_persona(raw)
    rec = {"language": s.language, "rows": [r.key for r, _ in s.rows], "raw": raw}
    return {**rec, "disc": p.disc, "description": p.description} if p else {**rec, "disc": None}


def seekers_of(root: Path, cfg) -> tuple[list[Seeker], object, int]:
    loaded = load_rows(root, ("ser",), pattern=cfg.personas.files, skip_invalid=cfg.skip_invalid)
    seekers, no_history = group_seekers(loaded.rows)
    return seekers, loaded, no_history


def run_personas(root: str | Path, out: str | Path, cfg, endpoints=None) -> dict:
    root, out = Path(root), Path(out)
    claim_dir(out, "data personas", [root], resume=True, create=False,
              run_state="run.json")   # the store makes it
    seekers, loaded, no_history = seekers_of(root, cfg)
    seekers = seekers[:cfg.limit] if cfg.limit else seekers
    inputs = {"root": str(root), "files": {f: job.sha256(root / f) for f in loaded.files}}
    settings = {k: v for k, v in job.section(cfg, "personas").items()}
    manifest = job.manifest("personas", cfg, inputs, settings)
    store = RunStore(out, manifest)
    mark_dir(out, "data personas")
    job.run_job("personas", cfg, [SeekerCase(s.id, s) for s in seekers], persona_case, store, endpoints)

    records = {s.id: store.records[s.id] for s in seekers}
    # deferred: tests patch load_embedding_model
    from peer_rl.models.encoders import load_embedding_model

    encoder = load_embedding_model(cfg.personas.embedding_model)
    clusters, assignment = {}, {}
    for lang in sorted({r["language"] for r in records.values()}):
        ids = [sid for sid, r in records.items() if r["language"] == lang and r["disc"]]
        if not ids:
            continue
        vecs = np.asarray(encoder.encode([records[i]["description"] for i in ids]), np.float64)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True) + 1e-12
        labels, info = cluster(vecs, cfg.personas.k, cfg.personas.k_max, cfg.seed)
        clusters[lang] = info
        assignment |= {sid: f"{lang}-{int(c)}" for sid, c in zip(ids, labels)}
    job.write_lines(out / PERSONAS_FILE, job.jsonl(
        {"seeker": sid, "language": r["language"], "disc": r["disc"],
         "description": r["description"], "cluster": assignment[sid], "rows": r["rows"]}
        for sid, r in records.items() if r["disc"]))
    write_atomic(out / CLUSTERS_FILE, json.dumps(clusters, indent=1))   # `rewrite` reads it
    ambiguous = sum(len(s.rows) for s in seekers if s.ambiguous)
    summary = summarise(records, assignment, clusters, len(loaded.rows), no_history,
                        len(loaded.invalid), ambiguous)
    figures = [job.bar_figure(out / "persona_clusters.png", "seekers per persona cluster",
                              summary["cluster_sizes"], "seekers")] if assignment else []
    return job.write_report(out, "data personas", summary, manifest, _tables(summary), figures)


def cluster(vecs: np.ndarray, k: int, k_max: int, seed: int) -> tuple[np.ndarray, dict]:
    """KMeans labels and how k was chosen: fixed, or the best silhouette over [2, k_max]."""
    from sklearn.cluster import KMeans  # deferred: scikit-learn (~1 s)
    from sklearn.metrics import silhouette_score  # deferred: scikit-learn (~1 s)

    n = len(vecs)
    distinct = len(np.unique(np.round(vecs, 6), axis=0))
    if k:
        k = min(k, distinct)
        how, scores = "fixed (personas.k)", {}
    elif distinct < 2 or n < 3:
        k, how, scores = 1, f"{n} seeker(s), {distinct} distinct: one cluster", {}
    else:
        scores = {}     # silhouette needs 2 <= k <= n - 1; more than `distinct` adds nothing
        for cand in range(2, min(k_max, distinct, n - 1) + 1):
            labels = KMeans(cand, random_state=seed, n_init=10).fit_predict(vecs)
            scores[cand] = float(silhouette_score(vecs, labels))
        k = max(scores, key=scores.get) if scores else 1
        how = "best silhouette"
    labels = KMeans(k, random_state=seed, n_init=10).fit_predict(vecs) if k > 1 \
        else np.zeros(n, dtype=int)
    return labels, {"k": int(k), "how": how, "silhouette": scores, "seekers": n,
                    "sizes": [int(x) for x in np.bincount(labels, minlength=k)]}


def summarise(records: dict, assignment: dict, clusters: dict, rows: int, no_history: int,
              invalid: int, ambiguous: int) -> dict:
    parsed = [r for r in records.values() if r["disc"]]
    sizes = Counter(assignment.values())
    by_cluster = {}
    for c in sorted(sizes):
        members = [records[s] for s, a in assignment.items() if a == c]
        by_cluster[c] = {"seekers": len(members), **{
            d: float(np.mean([m["disc"][d] for m in members])) for d in DISC}}
    return {"rows": rows, "rows_without_history": no_history, "invalid_skipped": invalid,
            "ambiguous_rows": ambiguous, "seekers": len(records), "personas": len(parsed),
            "unparsed": len(records) - len(parsed), "clusters": clusters,
            "cluster_sizes": dict(sorted(sizes.items())), "cluster_disc_means": by_cluster}


def _tables(s: dict) -> list[str]:
    head = job.table(["SER rows", "seekers", "personas", "unparsed", "rows without history",
                      "ambiguous rows"],
                     [[s["rows"], s["seekers"], s["personas"], s["unparsed"],
                       s["rows_without_history"], s["ambiguous_rows"]]])
    ks = job.table(["language", "k", "chosen by", "silhouette per k"],
                   [[lang, c["k"], c["how"], ", ".join(f"{k}: {v:.3f}" for k, v in
                                                      c["silhouette"].items()) or "-"]
                    for lang, c in s["clusters"].items()])
    disc = job.table(["cluster", "seekers", *DISC],
                     [[c, v["seekers"], *[v[d] for d in DISC]]
                      for c, v in s["cluster_disc_means"].items()])
    return [head, ks, disc]
