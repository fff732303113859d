"""`peer-rl bench rewards [N_GROUPS]`: the reward math's throughput (RUR, advantages)."""
from __future__ import annotations

import time

import numpy as np


def _median_seconds(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench_rewards(n_groups: int = 10_000, group_size: int = 4, dim: int = 384) -> list[tuple]:
    from peer_rl.algos import sequence_advantages  # deferred: pulls in torch
    # deferred: pulls in torch
    from peer_rl.algos.rewards import group_similarity, length_coefficient, rur_reweight
    import torch  # deferred: torch (~2 s); the CLI starts without it

    rng = np.random.default_rng(0)
    n = n_groups * group_size
    rewards = rng.uniform(0, 3, n)
    s_hist, s_group = rng.uniform(0, 1, n), rng.uniform(0, 1, n)
    words = rng.integers(1, 60, n)
    emb = rng.normal(size=(n, dim)).astype(np.float32)
    index = torch.arange(n_groups).repeat_interleave(group_size)
    rows = [
        ("length_coefficient", n, _median_seconds(lambda: length_coefficient(words))),
        ("rur_reweight", n, _median_seconds(lambda: rur_reweight(rewards, s_hist, s_group,
                                                         length_coefficient(words)))),
        ("group_similarity (d=384)", n, _median_seconds(lambda: group_similarity(emb, group_size))),
        ("grpo advantages", n, _median_seconds(lambda: sequence_advantages(
            "grpo", rewards, index), repeats=1)),
    ]
    return rows


def main(rest: list[str]) -> int:
    n_groups = int(rest[0]) if rest else 10_000
    print(f"reward math on {n_groups} groups of 4 (median of 5 runs)")
    print(f"{'function':28s} {'items':>8s} {'seconds':>10s} {'items/s':>12s}")
    for name, items, sec in bench_rewards(n_groups):
        print(f"{name:28s} {items:8d} {sec:10.4f} {items / max(sec, 1e-12):12.0f}")
    return 0
