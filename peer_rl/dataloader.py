"""A seeded, resumable prompt cursor: the data order depends only on (seed, epoch), so a run
resumed from a checkpoint sees exactly the prompts it would have seen."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


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
