"""The prompt pool of a GRPO run and a seeded, resumable cursor over it.

The pool is drawn once per run (`select_prompts`: the paper samples 2,000 textual and 1,000
multimodal prompts per run) and its ids are saved with every checkpoint; the order within it
depends only on (seed, epoch). A resumed run therefore sees exactly the prompts it would have
seen.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


class PromptPoolError(ValueError):
    """The prompt pool cannot be drawn or restored as asked (counts, ids)."""


@dataclass
class Cursor:
    epoch: int = 0
    position: int = 0

    def state(self) -> dict:
        return asdict(self)


class PromptLoader:
    def __init__(self, rows: list[dict], batch_size: int, seed: int = 0, shuffle: bool = True,
                 cursor: Cursor | None = None):
        if not rows:
            raise ValueError("no training prompts: the data files have no valid rows")
        if batch_size > len(rows):
            raise ValueError(f"data.train_batch_size={batch_size} exceeds the {len(rows)} "
                             "training prompts available")
        self.rows, self.batch_size, self.seed, self.shuffle = rows, batch_size, seed, shuffle
        self.cursor = cursor or Cursor()

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.rows))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))

    def next_batch(self) -> list[dict]:
        """The next B prompts; an epoch's tail shorter than B is dropped (the next epoch starts)."""
        if self.cursor.position + self.batch_size > len(self.rows):
            self.cursor = Cursor(self.cursor.epoch + 1, 0)
        order = self._order(self.cursor.epoch)
        idx = order[self.cursor.position: self.cursor.position + self.batch_size]
        self.cursor = Cursor(self.cursor.epoch, self.cursor.position + self.batch_size)
        return [self.rows[i] for i in idx]


def select_prompts(files: list[list[dict]], counts: list[int], seed: int) -> list[dict]:
    """Each file's rows, or a seeded sample of counts[i] of them (without replacement, kept in
    file order); 0, or a count past the end of the list, takes the whole file. A count larger
    than its file raises: a run asked for 2,000 prompts must not silently train on fewer."""
    out = []
    for i, rows in enumerate(files):
        k = counts[i] if i < len(counts) else 0
        if k > len(rows):
            raise PromptPoolError(f"data.prompts_per_file[{i}]={k}: the file has only {len(rows)} "
                             "valid prompt(s)")
        if k == 0 or k == len(rows):
            out += rows
            continue
        keep = np.sort(np.random.default_rng([seed, i]).choice(len(rows), size=k, replace=False))
        out += [rows[j] for j in keep]
    return out


def restore_prompts(rows: list[dict], ids: list[str], source: str) -> list[dict]:
    """The rows a checkpointed run trained on, in its order, by id; a missing id is an error
    naming it (the data changed under the run)."""
    by_id = {r["id"]: r for r in rows}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise PromptPoolError(f"{source}: {len(missing)} prompt id(s) of the checkpointed run are not "
                         f"in the data any more (first: {missing[:3]}); resume with the data it "
                         "was trained on, or start a new run")
    return [by_id[i] for i in ids]
