"""`peer-rl data holdout ROOT --out OUT`: a held-out split of the GRPO prompts, by dialogue.

The in-training evaluation (`trainer.eval_freq`) and `eval diversity` read `grpo/*_test.jsonl`;
PEER's card ships its GRPO prompt pool without one. OUT is ROOT with each `grpo/<name>.jsonl`
split in two: whole dialogues (peer_rl.data.dialogues.group_dialogues, as `data rounds` groups
them: rounds of one conversation never land on both sides) drawn in a seeded order until at
least `rows` rows are held, written to `grpo/<name>_test.jsonl`, the rest to
`grpo/<name>.jsonl`, each row byte for byte as read and in its order. A file that already has
its `_test` file is copied as it is. Every other file of ROOT (the other subsets, the frames)
is copied alongside, so OUT is the root the GRPO runs and the evaluations point at.
No model is called; the same seed gives the same split. The report is in `_jobs/holdout/`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from peer_rl.data.dialogues import DialogueRow, group_dialogues
from peer_rl.datajobs import job
from peer_rl.datajobs.rows import Row, load_rows
from peer_rl.files.out_paths import claim_dir


def held_dialogues(rows: list[Row], rows_wanted: int, seed: int) -> set[int]:
    """Indices into `rows` of the dialogues held out: drawn in a seeded order until at least
    `rows_wanted` rows are held (all but one dialogue at most: training keeps some)."""
    groups = group_dialogues([DialogueRow(r.data["history"], r.data["solution"],
                                          r.data.get("dialogue"),
                                          (r.data["language"], r.data["source"])) for r in rows])
    order = np.random.default_rng(seed).permutation(len(groups))
    held: set[int] = set()
    for g in order[:max(len(groups) - 1, 0)]:
        if len(held) >= rows_wanted:
            break
        held.update(groups[g].rows)
    return held


def run_holdout(root: str | Path, out: str | Path, rows: int = 200, seed: int = 0,
                force: bool = False) -> dict:
    root, out = Path(root), Path(out)
    if rows < 1:
        raise ValueError(f"--rows={rows}: expected >= 1 (rows held out per file)")
    claim_dir(out, "data holdout", [root], force=force)
    loaded = load_rows(root, ("grpo",))
    names = set(loaded.files)
    split, files = [], {}
    for f in loaded.files:
        test = f[:-len(".jsonl")] + "_test.jsonl"
        if f.endswith("_test.jsonl") or test in names:
            files[f] = "copied (has its held-out file)" if test in names else "copied"
            continue
        mine = [r for r in loaded.rows if r.file == f]
        held = held_dialogues(mine, rows, seed)
        kept = job.write_lines(out / f, (r.raw for i, r in enumerate(mine) if i not in held))
        n_held = job.write_lines(out / test, (r.raw for i, r in enumerate(mine) if i in held))
        split += [f, test]
        files[f] = f"{kept} rows kept, {n_held} held out in {test}"
    job.copy_root(root, out, replaced=set(split))
    summary = {"files": files, "rows_per_file": rows}
    manifest = {"job": "holdout", "input": str(root), "seed": seed, "rows": rows}
    directory = job.job_dir(out, "holdout")
    directory.mkdir(parents=True, exist_ok=True)
    return job.write_report(directory, "data holdout", summary, manifest,
                            [job.table(["file", "split"], [[k, v] for k, v in files.items()])],
                            [])
