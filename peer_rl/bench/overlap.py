"""`peer-rl bench overlap`: steps/s with trainer.async_training.staleness 0 versus 1.

The same run (the tiny recipe unless overridden) twice, once synchronous and once with the next
step's rollout, judging and redundancy inside this step's update. Steps/s is taken over the
steady-state steps (the first pays warm-up and has nothing to overlap; the last has no next
step). Then a projection, stated as one: with the stages apart, a synchronous step costs
score + update + sync and an overlapped one max(score, update) + sync, where score is the
rollout, judging and redundancy; that formula applied to the measured split, and to a cluster's
split where rollout is 70% of a synchronous step (the share verl reports for a 32B model).
On a machine whose cores all stages share, the overlapped stages also compete for the same
cores, so the measured gain is below the formula's.
"""
from __future__ import annotations

import argparse

from peer_rl.trainer.run import run

PARSES_ITS_ARGS = True          # peer-rl bench NAME --help goes to its argparse

import os
import tempfile
from pathlib import Path

import numpy as np

from peer_rl.tracking.metrics import read_metrics

SCORE_STAGES = ("rollout", "retrieval", "rollout_refined", "judge", "redundancy")


def _run(overrides: list[str], staleness: int, steps: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="peer-rl-bench-overlap-") as tmp:
        out = run(list(overrides) + [f"trainer.total_steps={steps}", "trainer.save_freq=0",
                                     f"trainer.output_dir={tmp}",
                                     f"trainer.async_training.staleness={staleness}"])
        return read_metrics(Path(out) / "metrics.jsonl")


def _median(recs: list[dict], key: str) -> float:
    return float(np.median([r.get(key, 0.0) for r in recs]))


def projected_speedup(score: float, update: float, sync: float) -> float:
    """Synchronous step time over overlapped step time, from the stage times alone."""
    return (score + update + sync) / (max(score, update) + sync)


def main(overrides: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="peer-rl bench overlap",
                                 epilog="other arguments: key=value overrides of the run")
    ap.add_argument("--steps", type=int, default=6)
    args, rest = ap.parse_known_args(overrides)
    steps = args.steps
    if steps < 3:
        raise ValueError("--steps: at least 3 (the first and the last are not steady state)")
    runs = {}
    for staleness in (0, 1):
        print(f"[bench overlap] staleness {staleness}: {steps} steps ...", flush=True)
        runs[staleness] = _run(rest, staleness, steps)[1:-1]
    print(f"\noverlap: steps 2-{steps - 1} of {steps} (medians), on this machine "
          f"({os.cpu_count()} CPUs)")
    print(f"{'staleness':>9s} {'step s':>8s} {'steps/s':>8s} {'score s':>8s} {'update s':>9s} "
          f"{'sync s':>7s} {'overlap s':>10s}")
    split = {}
    for staleness, recs in runs.items():
        score = sum(_median(recs, f"timing_s/{s}") for s in SCORE_STAGES)
        step, upd, sync = (_median(recs, f"timing_s/{k}") for k in ("step", "update", "sync"))
        split[staleness] = (score, upd, sync, step)
        print(f"{staleness:9d} {step:8.2f} {1 / step:8.4f} {score:8.2f} {upd:9.2f} {sync:7.2f} "
              f"{_median(recs, 'timing_s/overlap'):10.2f}")
    score, upd, sync, step0 = split[0]
    print(f"measured speed-up (steps/s, 1 over 0): {step0 / split[1][3]:.2f}x")
    print(f"projection from the synchronous split (score {score:.2f} s, update {upd:.2f} s, "
          f"sync {sync:.2f} s), stages not competing for cores: "
          f"{projected_speedup(score, upd, sync):.2f}x")
    other = 1.0 - 0.70
    cluster = projected_speedup(0.70, other * upd / (upd + sync), other * sync / (upd + sync))
    print(f"projection for a cluster where rollout is 70% of a synchronous step (update and sync "
          f"sharing the rest as measured here): {cluster:.2f}x")
    return 0
