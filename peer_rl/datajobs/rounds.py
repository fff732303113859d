"""`peer-rl data rounds INPUT --out OUT`: Gaussian sparse round sampling as its own job.

PEER keeps the informative middle rounds of each dialogue: rounds drawn from
N(N_r / 2, (N_r / 4)^2) (peer_rl.data.round_sampling). Two inputs:
- an ESConv-style JSON file (a list of dialogues with `dialog` turns): every kept round
  becomes a grpo row (history up to that supporter turn -> solution), as `data import-esconv`;
- a PEER-layout root or a grpo JSONL file: each file's rows are grouped into dialogues
  (peer_rl.data.dialogues.group_dialogues: by `dialogue` id where a row has one, else by
  histories continuing each other, within a language and source), a dialogue's rounds ordered
  by history length, and the kept rows are written as they came in. The rows of a shared
  opening that no reply places are a dialogue of their own, counted as `ambiguous_rows`.
No model is called; the same seed gives the same rows. OUT gets `grpo/<file>` (with the
frames under grpo/ that visual rows point to; a link to a file outside the root is refused) and
`_jobs/rounds/` with the kept-round histogram (JSON, Markdown, PNG).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from peer_rl.data.dialogues import DialogueRow, group_dialogues
from peer_rl.data.esconv import import_esconv
from peer_rl.data.round_sampling import gaussian_round_sample
from peer_rl.datajobs import job
from peer_rl.data.validate import ALLOW_OUTSIDE_ENV, images_may_leave_root
from peer_rl.datajobs.rows import InvalidInput, load_rows
from peer_rl.files.out_paths import LOCK_FILE, MARKER, claim_dir, copy_file

BINS = 10        # the histogram of relative positions r / N_r


def input_format(path: Path) -> str:
    if path.is_dir() or path.suffix == ".jsonl":
        return "grpo"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        why = "nested too deep" if isinstance(exc, RecursionError) else exc
        raise ValueError(f"{path}: expected an ESConv-style JSON list of dialogues, a grpo "
                         f"JSONL file or a PEER-layout root ({why})") from None
    if isinstance(data, list) and data and isinstance(data[0], dict) and "dialog" in data[0]:
        return "esconv"
    raise ValueError(f"{path}: a JSON file but not ESConv-style (expected a list of dialogues "
                     "with a `dialog` list)")


def run_rounds(src: str | Path, out: str | Path, rounds_per_dialogue: int = 3, seed: int = 0,
               language: str = "en", skip_invalid: bool = False, force: bool = False) -> dict:
    src, out = Path(src), Path(out)
    if rounds_per_dialogue < 1:
        raise ValueError(f"--rounds-per-dialogue={rounds_per_dialogue}: expected >= 1")
    claim_dir(out, "data rounds", [src] + ([src.parent.parent] if src.parent.name == "grpo"
                                           else []), force=force)

    fmt = input_format(src)
    if fmt == "esconv":
        rows, rep = import_esconv(src, rounds_per_dialogue, seed, language)
        written = {"grpo/esconv.jsonl": job.write_lines(out / "grpo/esconv.jsonl", job.jsonl(rows))}
        kept, dialogues, ambiguous = rep.kept_rounds, rep.dialogues, 0
        skipped = dict(rep.skipped)
    else:
        written, kept, dialogues, ambiguous, skipped = _grpo(src, out, rounds_per_dialogue, seed,
                                                             skip_invalid, force)
    summary = {"format": fmt, "dialogues": dialogues, "ambiguous_rows": ambiguous,
               "rows_out": sum(written.values()),
               "files": written, "skipped": skipped, **histogram(kept)}
    manifest = {"job": "rounds", "input": str(src), "format": fmt, "seed": seed,
                "rounds_per_dialogue": rounds_per_dialogue,
                "sha256": job.sha256(src) if src.is_file() else None}
    directory = job.job_dir(out, "rounds")
    directory.mkdir(parents=True, exist_ok=True)
    figures = [_figure(directory / "rounds_histogram.png", summary)]
    return job.write_report(directory, "data rounds", summary, manifest, _tables(summary),
                            figures)


def _grpo(src: Path, out: Path, k: int, seed: int, skip_invalid: bool, force: bool = False):
    if src.is_dir():
        loaded = load_rows(src, ("grpo",), skip_invalid=skip_invalid)
    else:   # one grpo file: its root is two levels up only in the layout; read it as a root
        root = src.parent.parent if src.parent.name == "grpo" else None
        if root is None:
            raise ValueError(f"{src}: a grpo JSONL file must sit in a grpo/ directory "
                             "(or pass the PEER-layout root)")
        loaded = load_rows(root, ("grpo",), pattern=f"grpo/{src.name}", skip_invalid=skip_invalid)
    root = src if src.is_dir() else src.parent.parent
    for path in _frames(root):
        target = out / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        copy_file(path, target)
    rng = np.random.default_rng(seed)
    written, kept, dialogues, ambiguous = {}, [], 0, 0
    for f in loaded.files:
        mine = [r for r in loaded.rows if r.file == f]
        groups = group_dialogues([DialogueRow(r.data["history"], r.data["solution"],
                                              r.data.get("dialogue"),
                                              (r.data["language"], r.data["source"]))
                                  for r in mine])
        keep = []
        for g in groups:
            rows = sorted((mine[i] for i in g.rows),
                          key=lambda r: (len(r.data["history"]), r.line))
            ambiguous += len(rows) if g.ambiguous else 0
            dialogues += 1
            for i in gaussian_round_sample(len(rows), k, rng):
                keep.append(rows[i - 1])
                kept.append((i, len(rows)))
        keep.sort(key=lambda r: r.line)
        written[f] = job.write_lines(out / f, (r.raw for r in keep))
    skipped = {"invalid rows": len(loaded.invalid)} if loaded.invalid else {}
    return written, kept, dialogues, ambiguous, skipped


def _frames(root: Path) -> list[Path]:
    """The files under <root>/grpo/ besides its JSONL files (the frames visual rows point to),
    which OUT gets copies of. A link to a file outside the root is refused, as `data check`
    refuses a row's image that leaves it (the same PEER_RL_ALLOW_IMAGES_OUTSIDE_ROOT=1 allows
    it): the copy would carry a file from anywhere into OUT. Checked before any is copied."""
    frames = [p for p in sorted((root / "grpo").rglob("*"))
              if p.is_file() and p.suffix != ".jsonl" and p.name not in (MARKER, LOCK_FILE)]
    if not images_may_leave_root():
        for path in frames:
            if not path.resolve().is_relative_to(root.resolve()):
                raise InvalidInput(f"{path}: a link to {path.resolve()}, outside the data root "
                                   f"{root}; `data rounds` copies the files under grpo/ and "
                                   "none from outside the root: put the file itself there (or "
                                   f"set {ALLOW_OUTSIDE_ENV}=1 to allow)")
    return frames


def histogram(kept: list[tuple[int, int]]) -> dict:
    """Kept rounds by relative position (r - 0.5) / N_r in BINS bins, and by round index."""
    rel = Counter(min(int((r - 0.5) / n * BINS), BINS - 1) for r, n in kept)
    return {"kept_rows": len(kept),
            "relative_position_histogram": [rel[b] for b in range(BINS)],
            "round_histogram": dict(sorted(Counter(r for r, _ in kept).items())),
            "mean_relative_position": float(np.mean([(r - 0.5) / n for r, n in kept]))
            if kept else None}


def _figure(path: Path, s: dict) -> Path:
    labels = {f"{b / BINS:.1f}-{(b + 1) / BINS:.1f}": v
              for b, v in enumerate(s["relative_position_histogram"])}
    return job.bar_figure(path, "kept rounds by position in their dialogue (r / N_r)", labels,
                          "rows")


def _tables(s: dict) -> list[str]:
    head = job.table(["input format", "dialogues", "ambiguous rows", "rows out",
                      "mean position r/N_r"],
                     [[s["format"], s["dialogues"], s["ambiguous_rows"], s["rows_out"],
                       s["mean_relative_position"] if s["mean_relative_position"] is not None
                       else "-"]])
    hist = job.table(["round", "rows"], [[r, n] for r, n in s["round_histogram"].items()])
    return [head, hist] + ([f"Skipped: {s['skipped']}"] if s["skipped"] else [])
