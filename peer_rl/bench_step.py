"""`peer-rl bench step`: the per-stage time split of tiny GRPO steps, from a real run.

Runs the tiny recipe (any overrides allowed) for a few steps and prints the median of each
stage over the steps after the first (which pays one-time warm-up costs).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

STAGES = ("rollout", "judge", "redundancy", "update", "sync", "controller", "step")


def main(overrides: list[str]) -> int:
    from peer_rl.train import run

    has = {o.split("=", 1)[0] for o in overrides}
    extra = [] if "trainer.total_steps" in has else ["trainer.total_steps=4"]
    with tempfile.TemporaryDirectory(prefix="peer-rl-bench-") as tmp:
        if "trainer.output_dir" not in has:
            extra.append(f"trainer.output_dir={tmp}")
        out = run(list(overrides) + extra + ["trainer.save_freq=0"])
        recs = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    timed = recs[1:] or recs
    print(f"\nper-stage time of a GRPO step (median over steps {timed[0]['step']}-{timed[-1]['step']}, "
          f"first step excluded as warm-up)")
    total = float(np.median([r["timing/step"] for r in timed]))
    print(f"{'stage':12s} {'seconds':>9s} {'share':>7s}")
    for stage in STAGES:
        sec = float(np.median([r[f"timing/{stage}"] for r in timed]))
        print(f"{stage:12s} {sec:9.3f} {100 * sec / total:6.1f}%")
    print(f"rollout tokens/s (median): {np.median([r['rollout/tokens_per_s'] for r in timed]):.0f}")
    return 0
