"""`peer-rl data rewrite ROOT --personas DIR --out OUT`: PEER's personality-based rewriting.

For each seeker of the SER train files (one per dialogue, peer_rl.datajobs.seekers) with a
persona (`data personas`), `rewrite.copies` times: a persona is drawn (seeded) from the
seeker's cluster, another seeker's where the cluster has one; the writer rewrites the seeker's
messages in that persona's voice, keeping what they say; the rewritten dialogue goes through
the filter judge (`data filter`'s three criteria). Every row of the dialogue whose rewrite the
filter keeps gets a copy with the seeker messages of its history replaced, `source: augmented`
and a new id; the reasoning steps, the candidate replies and all four labels stay as they were,
so they still hold. OUT is ROOT with those copies appended to their train files;
`OUT/_jobs/rewrite/` holds what was removed or unparsed, and the report: personas per cluster
and how far the rewritten messages moved from the originals (embedding distance, distinct-1/2).
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from peer_rl.data.layout import discover
from peer_rl.datajobs import job
from peer_rl.datajobs.filter import judge_dialogue
from peer_rl.datajobs.parse import parse_rewrite
from peer_rl.data.personas import PERSONAS_FILE, load_personas
from peer_rl.datajobs.personas import seekers_of
from peer_rl.datajobs.prompts import CRITERIA, rewrite_messages, rewrite_schema
from peer_rl.datajobs.rows import Row
from peer_rl.datajobs.seekers import Seeker
from peer_rl.evaluation.endpoints import Request
from peer_rl.evaluation.store import RunStore
from peer_rl.tracking.metrics import distinct_n
from peer_rl.files.out_paths import claim_dir


@dataclass(frozen=True)
class RewriteCase:
    id: str
    seeker: Seeker
    persona: dict          # the persona record drawn for this copy


def draw_persona(seeker_id: str, copy: int, personas: dict[str, dict], seed: int) -> dict:
    """Another seeker's persona from the same cluster (its own when it is alone there)."""
    own = personas[seeker_id]
    mates = sorted(s for s, p in personas.items() if p["cluster"] == own["cluster"]
                   and s != seeker_id)
    if not mates:
        return own
    digest = hashlib.sha256(f"{seed}:{seeker_id}:{copy}".encode()).digest()
    return personas[mates[int.from_bytes(digest[:8], "big") % len(mates)]]


def rewrite_case(case: RewriteCase):
    s, persona = case.seeker, case.persona
    n = len(s.utterances)
    raw = (yield "writer", Request(rewrite_messages(s.history, persona["description"],
                                                    s.language), schema=rewrite_schema(n)))[0]
    rec = {"seeker": s.id, "persona": persona["seeker"], "cluster": persona["cluster"],
           "raw_rewrite": raw}
    turns = parse_rewrite(raw, n)
    if turns is None:
        return {**rec, "rewritten": None}
    verdict, raw_filter = yield from judge_dialogue(_replaced_history(s.history, turns),
                                                    s.language)
    rec |= {"rewritten": turns, "raw_filter": raw_filter}
    if verdict is None:
        return {**rec, "filter": None}
    return {**rec, "filter": "remove" if verdict.remove else "keep",
            "criteria": verdict.criteria, "reason": verdict.reason}


def _replaced_history(history: list[dict], seeker_turns: list[str]) -> list[dict]:
    it = iter(seeker_turns)
    return [{**t, "content": next(it)} if t["role"] == "seeker" else t for t in history]


def rewrite_row(row: Row, history: list[dict], turns: list[str], new_id) -> dict | None:
    """The row with its history's seeker messages replaced (within the history block of its
    first user turn), `source: augmented` and `new_id`; None when a message is not found."""
    obj = json.loads(row.raw)
    k = next(i for i, m in enumerate(obj["messages"]) if m["role"] == "user")
    text = obj["messages"][k]["content"]
    mine = [t["content"] for t in history if t["role"] == "seeker"]
    pos, out = 0, []
    for old, new in zip(mine, turns):
        at = text.find(old, pos)
        if at < 0:
            return None
        out.append(text[pos:at] + new)
        pos = at + len(old)
    obj["messages"][k]["content"] = "".join(out) + text[pos:]
    obj["id"], obj["source"] = new_id, "augmented"
    return obj


def run_rewrite(root: str | Path, personas_dir: str | Path, out: str | Path, cfg,
                endpoints=None) -> dict:
    root, out = Path(root), Path(out)
    claim_dir(out, "data rewrite", [root, personas_dir], resume=True,
              run_state="_jobs/rewrite/run.json")
    personas = load_personas(personas_dir)
    seekers, loaded, no_history = seekers_of(root, cfg)
    if not [s for s in seekers if s.id in personas]:
        raise ValueError(f"--personas {personas_dir}: none of the {len(seekers)} seekers of "
                         f"{root} ({cfg.rewrite.files}) has a persona there; were they made "
                         "from this root?")
    cases = [RewriteCase(f"{s.id}#{c}", s, draw_persona(s.id, c, personas, cfg.seed))
             for s in seekers if s.id in personas for c in range(cfg.rewrite.copies)]
    cases = cases[:cfg.limit] if cfg.limit else cases
    inputs = {"root": str(root), "files": {f: job.sha256(root / f) for f in loaded.files},
              "personas": job.sha256(Path(personas_dir) / PERSONAS_FILE)}
    manifest = job.manifest("rewrite", cfg, inputs, job.section(cfg, "rewrite"))
    directory = job.job_dir(out, "rewrite")
    store = RunStore(directory, manifest)
    job.run_job("rewrite", cfg, cases, rewrite_case, store, endpoints)
    return materialise(root, out, loaded, seekers, personas, cases, store, manifest, cfg,
                       no_history)


def _new_ids(root: Path, n: int):
    """Integer ids after the largest integer id of the card's four subsets (its ids are
    integers unique across them), or None when the root uses string ids there."""
    biggest = 0
    for df in (d for d in discover(root) if d.subset in ("ser", "sft", "grpo", "safety")):
        for line in df.path.read_bytes().split(b"\n"):
            if line.strip():
                rid = json.loads(line).get("id")
                if isinstance(rid, str):
                    return None
                if isinstance(rid, int) and not isinstance(rid, bool):
                    biggest = max(biggest, rid)
    return iter(range(biggest + 1, biggest + 1 + n))


def materialise(root: Path, out: Path, loaded, seekers: list[Seeker], personas: dict,
                cases: list[RewriteCase], store: RunStore, manifest: dict, cfg,
                no_history: int) -> dict:
    records = [(c, store.records[c.id]) for c in cases]
    kept = [(c, r) for c, r in records if r.get("filter") == "keep"]
    n_rows = sum(len(c.seeker.rows) for c, _ in kept)
    ids = _new_ids(root, n_rows)
    added: dict[str, list[dict]] = {f: [] for f in loaded.files}
    skipped = Counter()
    for c, r in kept:
        for row, history in c.seeker.rows:
            m = sum(t["role"] == "seeker" for t in history)
            new_id = next(ids) if ids is not None else f"{row.data['id']}-aug{c.id.rsplit('#', 1)[1]}"
            obj = rewrite_row(row, history, r["rewritten"][:m], new_id)
            if obj is None:
                skipped["a seeker message not found verbatim in the row"] += 1
                continue
            added[row.file].append(obj)
    job.copy_root(root, out, set(loaded.files))
    for f in loaded.files:
        originals = [r.raw for r in loaded.rows if r.file == f]
        job.write_lines(out / f, originals + [json.dumps(o, ensure_ascii=False).encode()
                                              for o in added[f]])
    directory = job.job_dir(out, "rewrite")
    job.write_lines(directory / "removed.jsonl", job.jsonl(
        {"case": c.id, "criteria": r["criteria"], "reason": r["reason"],
         "rewritten": r["rewritten"]} for c, r in records if r.get("filter") == "remove"))
    job.write_lines(directory / "unparsed.jsonl", job.jsonl(
        {"case": c.id, "stage": "rewrite" if r["rewritten"] is None else "filter",
         "answer": r["raw_rewrite"] if r["rewritten"] is None else r["raw_filter"]}
        for c, r in records if r["rewritten"] is None or r.get("filter") is None))
    summary = summarise(records, kept, added, skipped, seekers, personas, cfg, no_history)
    figures = [job.bar_figure(directory / "rewrite_clusters.png",
                              "rewritten copies kept, per persona cluster",
                              summary["kept_per_cluster"], "copies")] if kept else []
    return job.write_report(directory, "data rewrite", summary, manifest, _tables(summary),
                            figures)


def movement(originals: list[str], rewrites: list[str], encode) -> dict:
    """How far rewritten messages moved: cosine distance to their originals, distinct-n."""
    if not originals:
        return {"pairs": 0}
    a = np.asarray(encode(originals), np.float64)
    b = np.asarray(encode(rewrites), np.float64)
    a /= np.linalg.norm(a, axis=1, keepdims=True) + 1e-12
    b /= np.linalg.norm(b, axis=1, keepdims=True) + 1e-12
    dist = 1.0 - np.sum(a * b, axis=1)
    return {"pairs": len(originals), "cosine_distance_mean": float(dist.mean()),
            "cosine_distance_median": float(np.median(dist)),
            "unchanged": int(sum(x == y for x, y in zip(originals, rewrites))),
            "distinct_1": {"original": distinct_n(originals, 1),
                           "rewritten": distinct_n(rewrites, 1)},
            "distinct_2": {"original": distinct_n(originals, 2),
                           "rewritten": distinct_n(rewrites, 2)}}


def summarise(records, kept, added, skipped, seekers, personas, cfg, no_history) -> dict:
    # deferred: tests patch load_embedding_model
    from peer_rl.models.encoders import load_embedding_model

    originals = [u for c, _ in kept for u in c.seeker.utterances]
    rewrites = [u for _, r in kept for u in r["rewritten"]]
    moved = movement(originals, rewrites, load_embedding_model(cfg.rewrite.embedding_model).encode) \
        if kept else {"pairs": 0}
    parsed = [r for _, r in records if r["rewritten"] is not None]
    verdicts = Counter(str(r.get("filter")) for r in parsed)
    criteria = Counter(x for r in parsed if r.get("filter") == "remove" for x in r["criteria"])
    return {
        "seekers": len(seekers), "seekers_with_persona": sum(s.id in personas for s in seekers),
        "rows_without_history": no_history,
        "ambiguous_rows": sum(len(s.rows) for s in seekers if s.ambiguous), "cases": len(records),
        "rewrites_unparsed": len(records) - len(parsed),
        "filter_kept": verdicts["keep"], "filter_removed": verdicts["remove"],
        "filter_unparsed": verdicts["None"],
        "filter_removed_per_criterion": {c: criteria[c] for c in CRITERIA},
        "rows_added": sum(len(v) for v in added.values()),
        "rows_added_per_file": {f: len(v) for f, v in added.items()},
        "rows_skipped": dict(skipped),
        "own_persona": sum(c.persona["seeker"] == c.seeker.id for c, _ in records),
        "kept_per_cluster": dict(sorted(Counter(c.persona["cluster"] for c, _ in kept).items())),
        "movement": moved,
    }


def _tables(s: dict) -> list[str]:
    head = job.table(["seekers (with persona)", "ambiguous rows", "copies tried",
                      "rewrite unparsed", "filter kept", "filter removed", "filter unparsed",
                      "rows added"],
                     [[f"{s['seekers']} ({s['seekers_with_persona']})", s["ambiguous_rows"],
                       s["cases"], s["rewrites_unparsed"], s["filter_kept"],
                       s["filter_removed"], s["filter_unparsed"], s["rows_added"]]])
    m = s["movement"]
    moved = job.table(["message pairs", "cosine distance (mean)", "(median)", "unchanged",
                       "distinct-1 orig -> new", "distinct-2 orig -> new"],
                      [[m["pairs"], m.get("cosine_distance_mean", "-"),
                        m.get("cosine_distance_median", "-"), m.get("unchanged", "-"),
                        f"{m['distinct_1']['original']:.3f} -> {m['distinct_1']['rewritten']:.3f}"
                        if m["pairs"] else "-",
                        f"{m['distinct_2']['original']:.3f} -> {m['distinct_2']['rewritten']:.3f}"
                        if m["pairs"] else "-"]])
    return [head, moved] + ([f"Rows skipped: {s['rows_skipped']}"] if s["rows_skipped"] else [])
