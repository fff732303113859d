"""Gaussian sparse sampling of dialogue rounds, as the PEER paper builds its data.

Middle rounds carry the richest support context; early rounds are greetings and late ones
goodbyes. Rounds are drawn from N(mu = N_r / 2, sigma = N_r / 4), rounded, kept in [1, N_r].
"""
from __future__ import annotations

import numpy as np


def gaussian_round_sample(n_rounds: int, k: int, rng: np.random.Generator,
                          max_draws: int = 1000) -> list[int]:
    """Up to k distinct 1-based round indices, sorted; all rounds when k >= n_rounds."""
    if n_rounds <= 0 or k <= 0:
        return []
    if k >= n_rounds:
        return list(range(1, n_rounds + 1))
    mu, sigma = n_rounds / 2.0, n_rounds / 4.0
    chosen: set[int] = set()
    for _ in range(max_draws):
        r = int(np.rint(rng.normal(mu, sigma)))
        if 1 <= r <= n_rounds:
            chosen.add(r)
            if len(chosen) == k:
                break
    return sorted(chosen)
