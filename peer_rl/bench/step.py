"""`peer-rl bench step [KEY=VALUE ...]`: the per-stage time split of tiny GRPO steps, from a real run.

Runs the tiny recipe (any overrides allowed) for a few steps and prints the median of each
stage over the steps after the first (which pays one-time warm-up costs).
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from peer_rl.tracking.metrics import read_metrics
from peer_rl.trainer.run import resolve_models, run

# ESCRAG-R1 steps (retrieval.enable) add the retrieval call and the second rollout pass
STAGES = ("rollout", "retrieval", "rollout_refined", "judge", "redundancy", "update", "sync",
          "controller", "overlap", "step")


def main(overrides: list[str]) -> int:
    has = {o.split("=", 1)[0] for o in overrides}
    extra = [] if "trainer.total_steps" in has else ["trainer.total_steps=4"]
    with tempfile.TemporaryDirectory(prefix="peer-rl-bench-") as tmp:
        if "trainer.output_dir" not in has:
            extra.append(f"trainer.output_dir={tmp}")
        out = run(list(overrides) + extra + ["trainer.save_freq=0"])
        recs = read_metrics(Path(out) / "metrics.jsonl")
        cfg = OmegaConf.load(Path(out) / "config.yaml")
        report = json.loads((Path(out) / "memory.json").read_text())
        memory, dtypes = report["peak_rss_gib"], report.get("dtype", {})
    timed = recs[1:] or recs
    print(f"\nper-stage time of a GRPO step (median over steps {timed[0]['step']}-{timed[-1]['step']}, "
          f"first step excluded as warm-up)")
    total = float(np.median([r["timing_s/step"] for r in timed]))
    print("compute dtype: " + "; ".join(f"{pool} {d}" for pool, d in dtypes.items()))
    print(f"{'stage':12s} {'seconds':>9s} {'share':>7s}")
    for stage in (s for s in STAGES if f"timing_s/{s}" in timed[0]):
        sec = float(np.median([r[f"timing_s/{stage}"] for r in timed]))
        print(f"{stage:12s} {sec:9.3f} {100 * sec / total:6.1f}%")
    print(f"rollout tokens/s (median): {np.median([r['rollout/tokens_per_s'] for r in timed]):.0f}")
    print(f"weight sync: {timed[-1]['sync/bytes'] / 2**20:.2f} MiB to each engine a step")
    if "actor/padding_share" in timed[0]:
        share = float(np.median([r["actor/padding_share"] for r in timed]))
        print(f"padding in the update's training forwards (median share of positions): "
              f"{100 * share:.1f}%")
    print("peak resident memory, GiB per worker: "
          + "; ".join(f"{pool} {peaks}" for pool, peaks in memory.items())
          + f" (sum {sum(sum(p) for p in memory.values()):.1f})")
    _image_share(timed, total, cfg)
    return 0


def _image_share(timed: list[dict], total: float, cfg) -> None:
    """Image preprocessing inside the stages: the policy's (measured in the update) and the
    engines' (vLLM runs the same processor inside generate: estimated as the processor's time
    per frame x the frames the rollout and judge saw per step)."""
    share = float(np.median([r.get("data/visual_share", 0.0) for r in timed]))
    policy_s = float(np.median([r.get("timing_s/image_preprocess", 0.0) for r in timed]))
    print(f"visual rows per step (median share): {100 * share:.0f}%")
    if not share:
        return
    from PIL import Image  # deferred: Pillow (only images need it)
    from transformers import AutoProcessor  # deferred: transformers (~3 s, pulls in torch)

    from peer_rl.data.bundled import sample_root  # deferred: pulls in PIL

    policy, _ = resolve_models(cfg)
    proc = AutoProcessor.from_pretrained(policy).image_processor
    frames = sorted((sample_root() / "grpo" / "images").glob("*.png"))
    t0 = time.perf_counter()
    for f in frames:
        with Image.open(f) as im:
            proc(images=[im.convert("RGB")], return_tensors="pt")
    per_frame = (time.perf_counter() - t0) / len(frames)
    n_visual = share * cfg.data.train_batch_size
    # rollout: 2 frames per visual prompt (its n samples share the prompt); judge: 1 frame per
    # sample (an upper bound: vLLM's processor cache serves repeats of the same frame)
    engine_s = per_frame * n_visual * (2 + cfg.rollout.n)
    print(f"image preprocessing, policy update (measured): {policy_s:.4f} s "
          f"({100 * policy_s / total:.2f}% of the step)")
    print(f"image preprocessing, rollout + judge engines (estimated at {1000 * per_frame:.2f} ms "
          f"per frame, at most): {engine_s:.4f} s ({100 * engine_s / total:.2f}% of the step)")
