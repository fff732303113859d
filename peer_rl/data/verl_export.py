"""grpo rows as verl's RL dataset rows (parquet), for the PEER reward manager inside verl.

verl's RLHFDataset reads `prompt` (the chat the policy answers), `data_source`,
`reward_model.ground_truth` and passes every other column through to the reward manager, which
reads the dialogue history and its language from `extra_info`. Rows with seeker frames are left
out and counted: the plug-in's judge is text-only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class ExportReport:
    written: dict[str, int] = field(default_factory=dict)   # split -> rows
    skipped: dict[str, int] = field(default_factory=dict)   # reason -> rows


def verl_row(row: dict, index: int, split: str) -> dict:
    return {"data_source": f"peer_rl/{row.get('source') or 'grpo'}",
            "prompt": [{"role": m["role"], "content": m["content"]} for m in row["messages"]],
            "ability": "emotional_support",
            "reward_model": {"style": "model", "ground_truth": row["solution"]},
            "extra_info": {"index": index, "split": split, "id": row["id"],
                           "language": row["language"],
                           "history": [{"role": u["role"], "content": u["content"]}
                                       for u in row["history"]]}}


def export_verl(rows: list[dict], out: str | Path, val_fraction: float = 0.05,
                seed: int = 0) -> ExportReport:
    """train.parquet and val.parquet under `out` (val: a seeded `val_fraction` of the rows,
    at least one when there are two or more)."""
    import datasets

    datasets.disable_progress_bars()
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"--val-fraction={val_fraction}: expected a number in [0, 1)")
    rep = ExportReport()
    text = [r for r in rows if not r.get("images")]
    if len(text) < len(rows):
        rep.skipped["visual row (the verl plug-in's judge is text-only)"] = len(rows) - len(text)
    if not text:
        raise ValueError("no text-only grpo rows to export")
    order = np.random.default_rng(seed).permutation(len(text))
    n_val = min(len(text) - 1, max(1 if len(text) > 1 and val_fraction > 0 else 0,
                                   round(val_fraction * len(text))))
    splits = {"val": order[:n_val], "train": order[n_val:]}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for split, idx in splits.items():
        if len(idx) == 0:
            continue
        data = [verl_row(text[i], int(i), split) for i in idx]
        datasets.Dataset.from_list(data).to_parquet(str(out / f"{split}.parquet"))
        rep.written[split] = len(data)
    return rep
