"""What every data job shares: its run store and manifest, the parties, writing an output root
whose files appear only complete, and the report (JSON, Markdown, figures).

A job's state lives in `<out>/_jobs/<job>/` (run.json, cases.jsonl, report.*, set-aside rows),
outside the subset directories, so `peer-rl data check <out>` reads only the data."""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path

from peer_rl.config.schema import public_config
from peer_rl.files.out_paths import (LOCK_FILE, MARKER, copy_file, save_figure, write_atomic,
                                     write_whole)
from peer_rl.datajobs.config import ROLES
from peer_rl.evaluation.endpoints import close_all, open_endpoints
from peer_rl.evaluation.runner import run_cases
from peer_rl.evaluation.store import RunStore
from peer_rl.tracking.plot import pyplot

log = logging.getLogger(__name__)

JOBS_DIR = "_jobs"
# what identifies a party's answers (concurrency and rate limits may change on rerun)
_PARTY_KEYS = ("url", "path", "model", "temperature", "top_p", "max_tokens", "structured")


def job_dir(out: str | Path, job: str) -> Path:
    return Path(out) / JOBS_DIR / job


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def manifest(job: str, cfg, inputs: dict, settings: dict) -> dict:
    """The job's run.json; its parties as public_config gives them (no key or secret)."""
    public = public_config(cfg)
    return {"job": job, "inputs": inputs, "settings": settings, "seed": cfg.seed,
            "parties": {r: {k: public[r][k] for k in _PARTY_KEYS} for r in ROLES[job]}}


def section(cfg, name: str) -> dict:
    """A job's settings for its manifest, as public_config gives them."""
    return public_config(cfg)[name]


def run_job(job: str, cfg, cases: list, program, store: RunStore,
            endpoints: dict | None = None, extra: dict | None = None) -> int:
    """Run the cases not yet on file with the job's parties (`endpoints`: already open ones,
    e.g. a test's scripted parties; else opened from cfg and closed after) and the in-process
    ones in `extra` (the cold start's retriever); returns how many ran now."""
    if not cases:
        raise ValueError(f"data {job}: the selected files hold no rows to work on (empty); "
                         "check the root and the job's subsets")
    if store.torn_lines:
        log.warning(f"{store.path}: dropped {store.torn_lines} line(s) cut off by an "
                    "interrupted write; those cases run again")
    if all(store.done(c.id) for c in cases):
        return 0
    if endpoints is not None:
        return run_cases(cases, program, {**(extra or {}), **endpoints}, store, cfg.batch_cases,
                         desc=f"data {job}")
    endpoints = {**open_endpoints({r: cfg[r] for r in ROLES[job]}, seed=cfg.seed),
                 **(extra or {})}
    try:
        return run_cases(cases, program, endpoints, store, cfg.batch_cases, desc=f"data {job}")
    finally:
        close_all(endpoints)


def write_lines(path: Path, lines: Iterable[bytes | str]) -> int:
    """A JSONL file written beside and renamed into place; returns the line count."""
    count = [0]

    def fill(fh) -> None:
        for line in lines:
            fh.write((line if isinstance(line, bytes) else line.encode("utf-8")) + b"\n")
            count[0] += 1

    write_whole(path, fill)
    return count[0]


def jsonl(rows: Iterable[dict]) -> Iterable[str]:
    return (json.dumps(r, ensure_ascii=False) for r in rows)


def copy_root(src: str | Path, dst: str | Path, replaced: set[str]) -> None:
    """Everything under `src` except its job state and the files a job rewrites (`replaced`,
    relative paths): images and untouched subsets come along as they are."""
    src, dst = Path(src), Path(dst)
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).as_posix()
        if rel.split("/")[0] == JOBS_DIR or rel in replaced or not path.is_file() \
                or path.name in (MARKER, LOCK_FILE):       # the source's own claims stay there
            continue
        target = dst / rel
        if target.exists() and target.stat().st_size == path.stat().st_size \
                and target.stat().st_mtime >= path.stat().st_mtime:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        copy_file(path, target)


def write_report(directory: Path, title: str, summary: dict, manifest_: dict,
                 tables: list[str], figures: list[Path]) -> dict:
    report = {"summary": summary, "manifest": manifest_, "figures": [f.name for f in figures]}
    write_atomic(directory / "report.json", json.dumps(report, ensure_ascii=False, indent=1))
    md = [f"# {title}", ""] + [t + "\n" for t in tables] + [f"![{f.stem}]({f.name})"
                                                             for f in figures]
    write_atomic(directory / "report.md", "\n".join(md) + "\n")
    return report


def table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def bar_figure(path: Path, title: str, bars: dict[str, float], ylabel: str) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 0.8 * len(bars) + 2), 3.2))
    ax.bar(list(bars), list(bars.values()), color="#4c72b0")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path
