"""`peer-rl data filter ROOT --out OUT`: PEER's data cleaning with an LLM judge.

Every row of the chosen subsets (rows that carry a dialogue history) is judged on the three
criteria; the verdict and the reason are recorded per row. OUT is ROOT without the removed
rows; `OUT/_jobs/filter/` holds the removed rows (`removed.jsonl`, with criteria and reason),
the rows whose verdict could not be parsed (`unparsed.jsonl`: kept out of OUT and counted,
never guessed), and the report (share per criterion, per source, per file).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from peer_rl.datajobs import job
from peer_rl.datajobs.parse import parse_filter
from peer_rl.datajobs.prompts import CRITERIA, CRITERION_TITLES, FILTER_SCHEMA, filter_messages
from peer_rl.datajobs.rows import Row, dialogue_turns, load_rows, row_source
from peer_rl.evaluation.endpoints import Request
from peer_rl.evaluation.store import RunStore
from peer_rl.files.out_paths import claim_dir


@dataclass(frozen=True)
class FilterCase:
    id: str
    row: Row


def judge_dialogue(turns: list[dict], lang: str):
    """One judge request -> (verdict or None, raw answer); shared with `data rewrite`."""
    raw = (yield "judge", Request(filter_messages(turns, lang), schema=FILTER_SCHEMA))[0]
    return parse_filter(raw), raw


def filter_case(case: FilterCase):
    row = case.row
    verdict, raw = yield from judge_dialogue(dialogue_turns(row), row.data["language"])
    rec = {"file": row.file, "line": row.line, "source": row_source(row), "raw": raw}
    if verdict is None:
        return {**rec, "verdict": None}
    return {**rec, "verdict": "remove" if verdict.remove else "keep",
            "criteria": verdict.criteria, "reason": verdict.reason}


def run_filter(root: str | Path, out: str | Path, cfg, endpoints=None) -> dict:
    root, out = Path(root), Path(out)
    # a rerun continues its run (one begun before runs left markers: by its run.json)
    claim_dir(out, "data filter", [root], resume=True, run_state="_jobs/filter/run.json")
    loaded = load_rows(root, tuple(cfg.filter.subsets), skip_invalid=cfg.skip_invalid)
    rows = loaded.rows[:cfg.limit] if cfg.limit else loaded.rows
    inputs = {"root": str(root), "files": {f: job.sha256(root / f) for f in loaded.files}}
    manifest = job.manifest("filter", cfg, inputs, job.section(cfg, "filter"))
    directory = job.job_dir(out, "filter")
    store = RunStore(directory, manifest)
    cases = [FilterCase(r.key, r) for r in rows]
    job.run_job("filter", cfg, cases, filter_case, store, endpoints)
    return materialise(root, out, loaded, rows, store, manifest)


def materialise(root: Path, out: Path, loaded, rows: list[Row], store: RunStore,
                manifest: dict) -> dict:
    """OUT from the finished store: judged files without removed or unparsed rows; rows past
    `limit` were not judged and are kept (the report counts them)."""
    judged = {r.key: store.records[r.key] for r in rows}
    by_file: dict[str, list[Row]] = {f: [] for f in loaded.files}
    for r in loaded.rows:
        by_file[r.file].append(r)
    job.copy_root(root, out, set(loaded.files))
    for f, file_rows in by_file.items():
        job.write_lines(out / f, (r.raw for r in file_rows
                                  if judged.get(r.key, {}).get("verdict", "keep") == "keep"))
    directory = job.job_dir(out, "filter")
    removed = [(r, judged[r.key]) for r in rows if judged[r.key]["verdict"] == "remove"]
    unparsed = [(r, judged[r.key]) for r in rows if judged[r.key]["verdict"] is None]
    job.write_lines(directory / "removed.jsonl", job.jsonl(
        {"file": r.file, "line": r.line, "criteria": rec["criteria"], "reason": rec["reason"],
         "row": r.data} for r, rec in removed))
    job.write_lines(directory / "unparsed.jsonl", job.jsonl(
        {"file": r.file, "line": r.line, "answer": rec["raw"], "row": r.data}
        for r, rec in unparsed))
    job.write_lines(directory / "invalid.txt", loaded.invalid)
    summary = summarise([judged[r.key] for r in rows], len(loaded.rows), len(loaded.invalid))
    figures = [job.bar_figure(directory / "filter_criteria.png", "rows removed, per criterion",
                              {CRITERION_TITLES[c]: v for c, v in
                               summary["share_per_criterion"].items()}, "share of judged rows")]
    return job.write_report(directory, "data filter", summary, manifest, _tables(summary),
                            figures)


def summarise(records: list[dict], rows_in: int, invalid: int) -> dict:
    n = len(records)
    verdicts = Counter(str(r["verdict"]) for r in records)
    per_criterion = Counter(c for r in records if r["verdict"] == "remove" for c in r["criteria"])
    sources: dict[str, Counter] = {}
    files: dict[str, Counter] = {}
    for r in records:
        for key, table in ((r["source"], sources), (r["file"], files)):
            table.setdefault(key, Counter())["judged"] += 1
            table[key][str(r["verdict"])] += 1
    return {
        "rows_in": rows_in, "judged": n, "not_judged": rows_in - n, "invalid_skipped": invalid,
        "kept": verdicts["keep"], "removed": verdicts["remove"], "unparsed": verdicts["None"],
        "rows_out": rows_in - verdicts["remove"] - verdicts["None"],
        "removed_share": job.share(verdicts["remove"], n),
        "removed_per_criterion": {c: per_criterion[c] for c in CRITERIA},
        "share_per_criterion": {c: job.share(per_criterion[c], n) for c in CRITERIA},
        "per_source": {s: _counts(c) for s, c in sorted(sources.items())},
        "per_file": {f: _counts(c) for f, c in sorted(files.items())},
    }


def _counts(c: Counter) -> dict:
    return {"judged": c["judged"], "kept": c["keep"], "removed": c["remove"],
            "unparsed": c["None"], "removed_share": job.share(c["remove"], c["judged"])}


def _tables(s: dict) -> list[str]:
    head = job.table(["rows in", "judged", "kept", "removed", "unparsed (set aside)",
                      "invalid (skipped)", "rows out", "removed share"],
                     [[s["rows_in"], s["judged"], s["kept"], s["removed"], s["unparsed"],
                       s["invalid_skipped"], s["rows_out"], f"{s['removed_share']:.1%}"]])
    crit = job.table(["criterion", "rows", "share of judged"],
                     [[CRITERION_TITLES[c], s["removed_per_criterion"][c],
                       f"{s['share_per_criterion'][c]:.1%}"] for c in CRITERIA])
    src = job.table(["source", "judged", "kept", "removed", "unparsed", "removed share"],
                    [[k, v["judged"], v["kept"], v["removed"], v["unparsed"],
                      f"{v['removed_share']:.1%}"] for k, v in s["per_source"].items()])
    return [head, "A row may meet several criteria.\n\n" + crit, src]
