"""`peer-rl data cold-start ROOT --out OUT`: ESCRAG-R1's cold-start demonstrations written by a
strong model (the paper: 500 GPT-4o demonstrations of structured reasoning and a final reply,
the SFT that teaches the format before GRPO).

From the distinct dialogue contexts of ROOT's `cold_start.subsets` files of the
`cold_start.splits` (default train: the test contexts are the CCJ evaluation's; rows whose
history ends with the seeker turn to answer), `cold_start.count` are drawn (seeded, without
replacement).
Each drawn context teaches one of the policy's two prompts (peer_rl.prompts.escrag), the ones
GRPO asks:

- pass 1 (`initial_messages`): the teacher answers the dialogue;
- pass 2 (`refined_messages`, the prompt whose reply the reward scores and GRPO trains): the
  teacher first answers pass 1, its reply is the initial response, `cold_start.k` exemplars are
  retrieved for it as the training loop retrieves (the seeker's last turn and the initial reply,
  none of the context's own dialogue) from `cold_start.index` (default: ROOT's train exemplars),
  and the teacher answers the pass-2 prompt built from the dialogue, that reply and those
  exemplars. Its pass-1 answer is only the draft, not a demonstration of its own.

`cold_start.refined_share` of the contexts (default 0.5) teach pass 2, by their place in the draw
(`passes`), so any first N hold floor(N x share) of them. An answer with one closed `<think>`
block and a non-empty reply becomes a row of `OUT/cold_start/train.jsonl` (the layout
`peer-rl sft recipe=escrag_sft` reads), marked `"pass": "initial"` or `"refined"`; any other answer
is set aside in `OUT/_jobs/cold_start/unparsed.jsonl` and counted, never repaired. Rerun the
command to continue an interrupted run; raise `cold_start.count` to extend it (the draw is a
prefix of a seeded permutation and a context's pass depends on its place only, so earlier
contexts stay in as they were).
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from pathlib import Path

from peer_rl.data.escrag import PASSES, canonical_pass
from peer_rl.data.layout import file_split
from peer_rl.datajobs import job
from peer_rl.datajobs.rows import Row, load_rows, row_source
from peer_rl.evaluation.retriever import LocalRetriever
from peer_rl.files.out_paths import claim_dir, read_json
from peer_rl.prompts.escrag import (format_reasoned, initial_messages, parse_reasoned,
                                    refined_messages)
from peer_rl.evaluation.endpoints import Request
from peer_rl.evaluation.store import MANIFEST_FILE, RunStore
from peer_rl.evaluation.supporter import Query
from peer_rl.retrieval.corpus import index_from_root, load_exemplars
from peer_rl.retrieval.index import INFO_FILE

SOURCE = "peer-rl data cold-start"


@dataclass(frozen=True)
class ContextCase:
    id: str
    row: Row
    pass_: str = "initial"           # which of the policy's prompts it teaches


def contexts(rows: list[Row]) -> tuple[list[Row], Counter]:
    """One row per distinct (language, history) whose history ends with a seeker turn; the
    counts of what was passed over."""
    seen, kept, skipped = set(), [], Counter()
    for r in rows:
        history = r.data.get("history") or []
        if not history or history[-1]["role"] != "seeker":
            skipped["history not ending with a seeker turn"] += 1
            continue
        key = (r.data["language"], tuple((t["role"], t["content"]) for t in history))
        if key in seen:
            skipped["same context as an earlier row"] += 1
            continue
        seen.add(key)
        kept.append(r)
    return kept, skipped


def draw(rows: list[Row], count: int, seed: int) -> list[Row]:
    order = list(range(len(rows)))
    random.Random(f"cold-start-{seed}").shuffle(order)
    return [rows[i] for i in order[:count]]


def passes(n: int, refined_share: float) -> list[str]:
    """The pass each of the first n drawn contexts teaches: the (i+1)-th is pass 2 ("refined")
    when floor((i + 1) x share) > floor(i x share), so the first N hold floor(N x share) pass-2
    contexts for every N (0.5: initial, refined, initial, refined, ...)."""
    share = Fraction(refined_share).limit_denominator(10 ** 6)
    return ["refined" if (i + 1) * share // 1 > i * share // 1 else "initial" for i in range(n)]


def demo_case(case: ContextCase, k: int = 3):
    d = case.row.data
    history, lang = d["history"], d["language"]
    raw = (yield "teacher", Request(initial_messages(history, lang)))[0]
    record = {"file": case.row.file, "line": case.row.line, "language": lang,
              "source": row_source(case.row), "pass": case.pass_}
    if case.pass_ == "initial":
        return {**record, "raw": raw, "complete": parse_reasoned(raw).complete}
    draft = parse_reasoned(raw).reply          # the initial response, as the trainer takes it
    [exemplars] = yield "retrieval", [Query(history, draft, k, d.get("dialogue"))]
    refined = (yield "teacher", Request(refined_messages(history, lang, draft,
                                                         list(exemplars))))[0]
    return {**record, "initial_raw": raw, "draft": draft, "exemplars": list(exemplars),
            "raw": refined, "complete": parse_reasoned(refined).complete}


def demo_messages(rec: dict, row: dict) -> list[dict]:
    """The prompt a finished case's demonstration answers: the one the teacher was asked."""
    if canonical_pass(rec["pass"]) == "refined":   # "final" in a run begun before the rename
        return refined_messages(row["history"], row["language"], rec["draft"], rec["exemplars"])
    return initial_messages(row["history"], row["language"])


def pass_two_source(root: Path, cfg) -> dict:
    """What identifies the exemplars pass 2 retrieves from, for the run's manifest:
    `cold_start.index`'s index.json, else ROOT's train exemplar files (read, not yet indexed)."""
    c = cfg.cold_start
    if c.index:
        if not (Path(c.index) / INFO_FILE).is_file():
            raise FileNotFoundError(f"cold_start.index={c.index!r}: no {INFO_FILE} there (build "
                                    f"one with `peer-rl index build {root} --out DIR`)")
        info = read_json(Path(c.index) / INFO_FILE, "index info")
        return {k: info.get(k) for k in ("source_sha256", "embedding_model", "count")}
    try:
        rows, src = load_exemplars(root, cfg.skip_invalid)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"cold_start.refined_share={c.refined_share}: pass 2 retrieves "
                                f"exemplars, and {exc}; set cold_start.index to a built index "
                                "or cold_start.refined_share=0") from None
    return {"source_sha256": src["sha256"], "embedding_model": c.embedding_model,
            "count": len(rows)}


def pass_two_index(root: Path, directory: Path, cfg) -> Path:
    """The exemplar index pass 2 retrieves from: `cold_start.index`, else one built from ROOT's
    train exemplars into the job's directory (kept while those files are unchanged)."""
    c = cfg.cold_start
    if c.index:
        return Path(c.index)
    return index_from_root(root, directory / "index", c.embedding_model,
                           skip_invalid=cfg.skip_invalid)


def as_begun(directory: Path, manifest: dict) -> dict:
    """The manifest under the names of the run it continues: one begun before pass 2 was
    `refined` recorded its share as `final_share` (its cases.jsonl, `"pass": "final"`), and
    goes on with the same settings under either name."""
    path = directory / MANIFEST_FILE
    if not path.is_file():
        return manifest
    begun = read_json(path, "run manifest").get("settings")
    settings = manifest["settings"]
    if isinstance(begun, dict) and "final_share" in begun and "refined_share" in settings:
        return {**manifest, "settings": {("final_share" if k == "refined_share" else k): v
                                         for k, v in settings.items()}}
    return manifest


def open_retriever(index_dir: Path):
    return LocalRetriever(index_dir)          # queries embedded with the index's own model


def run_cold_start(root: str | Path, out: str | Path, cfg, endpoints=None) -> dict:
    root, out = Path(root), Path(out)
    claim_dir(out, "data cold-start", [root], resume=True,
              run_state="_jobs/cold_start/run.json")     # a rerun continues its run
    c = cfg.cold_start
    loaded = load_rows(root, tuple(c.subsets), skip_invalid=cfg.skip_invalid)
    rows = [r for r in loaded.rows if file_split(r.file) in c.splits]
    left_out = Counter(file_split(r.file) for r in loaded.rows if file_split(r.file) not in
                       c.splits)
    pool, skipped = contexts(rows)
    if not pool and left_out:
        raise ValueError(f"{root}: no dialogue context in the {', '.join(c.splits)} split(s) of "
                         f"{', '.join(c.subsets)} (left out: {dict(left_out)}); name the splits "
                         "with cold_start.splits")
    chosen = draw(pool, cfg.limit or c.count, cfg.seed)
    cases = [ContextCase(r.key, r, p) for r, p in zip(chosen, passes(len(chosen),
                                                                     c.refined_share))]
    directory = job.job_dir(out, "cold_start")
    inputs = {"root": str(root), "files": {f: job.sha256(root / f) for f in loaded.files
                                           if file_split(f) in c.splits}}
    # the count is left out: a larger one extends the same seeded draw (as `limit` does)
    settings = {"subsets": list(c.subsets), "splits": list(c.splits)}
    if c.refined_share > 0:
        settings |= {"refined_share": c.refined_share, "k": c.k}
        inputs["exemplars"] = pass_two_source(root, cfg)
    manifest = as_begun(directory, job.manifest("cold_start", cfg, inputs, settings))
    store = RunStore(directory, manifest)
    extra = {}
    if c.refined_share > 0 and (endpoints is None or "retrieval" not in endpoints) and any(
            x.pass_ == "refined" and not store.done(x.id) for x in cases):
        # built (or found unchanged) in the run's directory, which the store holds locked
        extra["retrieval"] = open_retriever(pass_two_index(root, directory, cfg))
    job.run_job("cold_start", cfg, cases, partial(demo_case, k=c.k), store, endpoints, extra)
    demos, unparsed = [], []
    for case in cases:
        rec, d = store.records[case.id], case.row.data
        if rec.get("complete"):
            parsed = parse_reasoned(rec["raw"])
            demos.append({"id": f"cold-{len(demos) + 1:05d}", "language": d["language"],
                          "pass": case.pass_, "source": SOURCE, "context": case.id,
                          "messages": demo_messages(rec, d) + [
                              {"role": "assistant",
                               "content": format_reasoned(parsed.reasoning, parsed.reply)}]})
        else:
            unparsed.append({"file": rec.get("file"), "line": rec.get("line"),
                             "pass": case.pass_, "answer": rec.get("raw", rec.get("error")),
                             "row": d})
    job.write_lines(out / "cold_start" / "train.jsonl", job.jsonl(demos))
    job.write_lines(directory / "unparsed.jsonl", job.jsonl(unparsed))
    job.write_lines(directory / "invalid.txt", loaded.invalid)
    by_pass = {p: {"asked": sum(x.pass_ == p for x in cases),
                   "demonstrations": sum(x["pass"] == p for x in demos),
                   "unparsed": sum(u["pass"] == p for u in unparsed)} for p in PASSES}
    summary = {"rows_in": len(rows), "contexts": len(pool), "asked": len(cases),
               "demonstrations": len(demos), "unparsed": len(unparsed),
               "refined_share": c.refined_share, "passes": by_pass,
               "exemplars": manifest["inputs"].get("exemplars"),
               "short_of_count": max(0, (cfg.limit or c.count) - len(pool)),
               "invalid_skipped": len(loaded.invalid), "passed_over": dict(skipped),
               "splits": list(c.splits), "left_out_splits": dict(left_out),
               "per_language": dict(Counter(x["language"] for x in demos))}
    table = job.table(["rows in", "distinct contexts", "asked", "demonstrations",
                       "unparsed (set aside)", "invalid (skipped)"],
                      [[summary["rows_in"], summary["contexts"], summary["asked"],
                        summary["demonstrations"], summary["unparsed"],
                        summary["invalid_skipped"]]])
    per_pass = job.table(["pass", "asked", "demonstrations", "unparsed (set aside)"],
                         [[f"{p} ({'pass 1' if p == 'initial' else 'pass 2'})", v["asked"],
                           v["demonstrations"], v["unparsed"]] for p, v in by_pass.items()])
    return job.write_report(directory, "data cold-start", summary, manifest, [table, per_pass],
                            [])
