"""`peer-rl data cold-start ROOT --out OUT`: ESCRAG-R1's cold-start demonstrations written by a
strong model (the paper: 500 GPT-4o demonstrations of structured reasoning and a final reply,
the SFT that teaches the format before GRPO).

From the distinct dialogue contexts of ROOT's `cold_start.subsets` files (rows whose history ends
with the seeker turn to answer), `cold_start.count` are drawn (seeded, without replacement); the
teacher answers each with the policy's own pass-1 prompt (peer_rl.prompts.escrag.initial_messages),
so the demonstrations teach exactly the prompt GRPO will ask. An answer with one closed `<think>`
block and a non-empty reply becomes a row of `OUT/cold_start/train.jsonl` (the layout
`peer-rl sft recipe=escrag_sft` reads); any other answer is set aside in
`OUT/_jobs/cold_start/unparsed.jsonl` and counted, never repaired. Rerun the command to continue
an interrupted run; raise `cold_start.count` to extend it (the draw is a prefix of a seeded
permutation, so earlier contexts stay in).
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from peer_rl.datajobs import job
from peer_rl.datajobs.rows import Row, load_rows, row_source
from peer_rl.prompts.escrag import format_reasoned, initial_messages, parse_reasoned
from peer_rl.evaluation.endpoints import Request
from peer_rl.evaluation.store import RunStore

SOURCE = "peer-rl data cold-start"


@dataclass(frozen=True)
class ContextCase:
    id: str
    row: Row


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


def demo_case(case: ContextCase):
    d = case.row.data
    raw = (yield "teacher", Request(initial_messages(d["history"], d["language"])))[0]
    parsed = parse_reasoned(raw)
    return {"file": case.row.file, "line": case.row.line, "language": d["language"],
            "source": row_source(case.row), "raw": raw, "complete": parsed.complete}


def run_cold_start(root: str | Path, out: str | Path, cfg, endpoints=None) -> dict:
    from peer_rl.data.out_paths import claim_dir

    root, out = Path(root), Path(out)
    claim_dir(out, "data cold-start", [root], resume=True,
              run_state="_jobs/cold_start/run.json")     # a rerun continues its run
    c = cfg.cold_start
    loaded = load_rows(root, tuple(c.subsets), skip_invalid=cfg.skip_invalid)
    pool, skipped = contexts(loaded.rows)
    chosen = draw(pool, cfg.limit or c.count, cfg.seed)
    inputs = {"root": str(root), "files": {f: job.sha256(root / f) for f in loaded.files}}
    # the count is left out: a larger one extends the same seeded draw (as `limit` does)
    manifest = job.manifest("cold_start", cfg, inputs, {"subsets": list(c.subsets)})
    directory = job.job_dir(out, "cold_start")
    store = RunStore(directory, manifest)
    cases = [ContextCase(r.key, r) for r in chosen]
    job.run_job("cold_start", cfg, cases, demo_case, store, endpoints)
    demos, unparsed = [], []
    for case in cases:
        rec, d = store.records[case.id], case.row.data
        if rec.get("complete"):
            parsed = parse_reasoned(rec["raw"])
            demos.append({"id": f"cold-{len(demos) + 1:05d}", "language": d["language"],
                          "pass": "initial", "source": SOURCE, "context": case.id,
                          "messages": initial_messages(d["history"], d["language"]) + [
                              {"role": "assistant",
                               "content": format_reasoned(parsed.reasoning, parsed.reply)}]})
        else:
            unparsed.append({"file": rec.get("file"), "line": rec.get("line"),
                             "answer": rec.get("raw", rec.get("error")), "row": d})
    job.write_lines(out / "cold_start" / "train.jsonl", job.jsonl(demos))
    job.write_lines(directory / "unparsed.jsonl", job.jsonl(unparsed))
    job.write_lines(directory / "invalid.txt", loaded.invalid)
    summary = {"rows_in": len(loaded.rows), "contexts": len(pool), "asked": len(cases),
               "demonstrations": len(demos), "unparsed": len(unparsed),
               "short_of_count": max(0, (cfg.limit or c.count) - len(pool)),
               "invalid_skipped": len(loaded.invalid), "passed_over": dict(skipped),
               "per_language": dict(Counter(x["language"] for x in demos))}
    table = job.table(["rows in", "distinct contexts", "asked", "demonstrations",
                       "unparsed (set aside)", "invalid (skipped)"],
                      [[summary["rows_in"], summary["contexts"], summary["asked"],
                        summary["demonstrations"], summary["unparsed"],
                        summary["invalid_skipped"]]])
    return job.write_report(directory, "data cold-start", summary, manifest, [table], [])
