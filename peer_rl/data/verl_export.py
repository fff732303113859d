"""grpo rows as verl's RL dataset rows (parquet), for the PEER reward manager inside verl.

verl's RLHFDataset reads `prompt` (the chat the policy answers), `data_source`,
`reward_model.ground_truth` and passes every other column through to the reward manager, which
reads the dialogue history and its language from `extra_info`, and from `extra_info.split`
whether the row is scored as validation (docs/verl.md). Rows of the held-out files
(`grpo/*_test.jsonl`) go to test.parquet only; val.parquet is a seeded fraction of the other
rows, train.parquet the rest. Rows with seeker frames are left out and counted: the plug-in's
judge is text-only.

`to-verl.json` beside the parquet files lists what the run wrote; a later run into the same
directory (--force) removes the files of that list it does not write again, and refuses a
same-named file no run wrote, so no split of an earlier run is left beside the new ones. Every
file is written whole (beside, fsync, rename), the manifest last; a manifest that does not
parse is named, and a later --force is refused until it is moved aside.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from peer_rl.files.out_paths import DamagedFile, OutputError, write_atomic, write_whole

SPLITS = ("train", "val", "test")
MANIFEST = "to-verl.json"
TEST_FILES = "*_test.jsonl"          # the held-out grpo files (peer-rl's own evaluation's)


@dataclass
class ExportReport:
    written: dict[str, int] = field(default_factory=dict)   # split -> rows
    skipped: dict[str, int] = field(default_factory=dict)   # reason -> rows
    removed: list[str] = field(default_factory=list)        # an earlier run's files not rewritten


def is_test_file(path: str | Path) -> bool:
    return Path(path).match(TEST_FILES)


def verl_row(row: dict, index: int, split: str) -> dict:
    return {"data_source": f"peer_rl/{row.get('source') or 'grpo'}",
            "prompt": [{"role": m["role"], "content": m["content"]} for m in row["messages"]],
            "ability": "emotional_support",
            "reward_model": {"style": "model", "ground_truth": row["solution"]},
            "extra_info": {"index": index, "split": split, "id": row["id"],
                           "language": row["language"],
                           "history": [{"role": u["role"], "content": u["content"]}
                                       for u in row["history"]]}}


def _splits(train: list[dict], test: list[dict], val_fraction: float,
            seed: int) -> dict[str, list[dict]]:
    """val: a seeded `val_fraction` of the training rows (at least one when there are two or
    more and the fraction is above 0); test: the held-out rows as they are."""
    order = np.random.default_rng(seed).permutation(len(train))
    n_val = min(max(len(train) - 1, 0), max(1 if len(train) > 1 and val_fraction > 0 else 0,
                                            round(val_fraction * len(train))))
    return {"train": [verl_row(train[i], int(i), "train") for i in order[n_val:]],
            "val": [verl_row(train[i], int(i), "val") for i in order[:n_val]],
            "test": [verl_row(r, i, "test") for i, r in enumerate(test)]}


def _listed(manifest: Path) -> set[str]:
    """The files an earlier run's manifest lists (none when there is no manifest). One that
    is not {"files": [names]} is named: which splits are ours to remove is then unknown."""
    if not manifest.is_file():
        return set()
    try:
        found = json.loads(manifest.read_text(encoding="utf-8"))
        why = 'expected {"files": [...]}'
    except (ValueError, UnicodeDecodeError) as exc:
        found, why = None, f"not JSON: {exc}"
    files = found.get("files") if isinstance(found, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise DamagedFile(f"{manifest}: damaged ({why}); it lists the splits an earlier run "
                          "wrote, which --force replaces: move it aside and rerun (a split this "
                          "run does not write is then refused by name)")
    return set(files)


def _stale(out: Path, writing: set[str]) -> list[Path]:
    """Files of an earlier run this one will not write again; refuses a same-named file that
    no run's manifest lists (not ours to delete, and stale beside the new splits)."""
    ours = _listed(out / MANIFEST)
    stale = []
    for name in (f"{s}.parquet" for s in SPLITS):
        path = out / name
        if name in writing or not path.exists():
            continue
        if name not in ours:
            raise OutputError(f"--out {out}: {name} is not listed in {MANIFEST} (no to-verl run "
                              "wrote it) and this run writes no such split; remove it or choose "
                              "a new directory")
        stale.append(path)
    return stale


def export_verl(rows: list[dict], out: str | Path, val_fraction: float = 0.05, seed: int = 0,
                test_rows: list[dict] = ()) -> ExportReport:
    """train.parquet, val.parquet and test.parquet (`test_rows`, the held-out files) under
    `out`, and to-verl.json listing them; an earlier run's files not written again are removed."""
    import datasets  # deferred: datasets (~1 s, pulls in pyarrow)

    datasets.disable_progress_bars()
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"--val-fraction={val_fraction}: expected a number in [0, 1)")
    rep = ExportReport()
    train = [r for r in rows if not r.get("images")]
    test = [r for r in test_rows if not r.get("images")]
    n_visual = len(rows) + len(test_rows) - len(train) - len(test)
    if n_visual:
        rep.skipped["visual row (the verl plug-in's judge is text-only)"] = n_visual
    if not train:
        raise ValueError("no text-only grpo training rows to export (held-out *_test files "
                         "go to test.parquet only)")
    splits = {k: v for k, v in _splits(train, test, val_fraction, seed).items() if v}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stale = _stale(out, {f"{s}.parquet" for s in splits})
    for split, data in splits.items():
        table = datasets.Dataset.from_list(data)
        write_whole(out / f"{split}.parquet", lambda fh, t=table: t.to_parquet(fh))
        rep.written[split] = len(data)
    for path in stale:
        path.unlink()
        rep.removed.append(path.name)
    write_atomic(out / MANIFEST, json.dumps({
        "files": [f"{s}.parquet" for s in splits], "rows": rep.written, "skipped": rep.skipped,
        "val_fraction": val_fraction, "seed": seed}, indent=1) + "\n")
    return rep
