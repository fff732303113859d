"""`peer-rl train`: resolve the config, load prompts, start Ray and the pools, run the controller."""
from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

from peer_rl.config import load_config, save_config
from peer_rl.runtime import init_ray


def resolve_models(cfg) -> tuple[str, str]:
    """Policy and judge paths; empty paths mean the tiny models, built offline once and cached."""
    policy, judge = cfg.model.path, cfg.reward_model.path
    if not policy or not judge:
        from peer_rl.tiny_models import ensure_tiny_models

        cache = cfg.model.tiny_cache_dir or os.path.join(
            os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "peer-rl", "tiny")
        tiny = ensure_tiny_models(cache)
        policy, judge = policy or tiny["policy"], judge or tiny["judge"]
    for key, path in (("model.path", policy), ("reward_model.path", judge)):
        if not Path(path, "config.json").exists():
            raise FileNotFoundError(f"{key}={path!r}: no config.json there (expected an HF model "
                                    "directory)")
    return str(policy), str(judge)


def load_prompts(cfg) -> list[dict]:
    """Validated grpo rows of data.train_files; invalid rows fail, or are counted and skipped."""
    from peer_rl.data.loading import load_subset
    from peer_rl.data.sample import sample_root

    root = Path(cfg.data.root) if cfg.data.root else sample_root()
    rows: list[dict] = []
    for rel in cfg.data.train_files:
        if not (root / rel).exists():
            raise FileNotFoundError(f"data.train_files: {root / rel} does not exist")
        subset, name = Path(rel).parts[0], Path(rel).name
        res = load_subset(root, subset, name, skip_invalid=cfg.data.skip_invalid)
        if res.n_skipped:
            reasons = Counter()
            for rep in res.reports:
                reasons.update(rep.reasons())
            print(f"[peer-rl] {rel}: skipped {res.n_skipped} invalid row(s): {dict(reasons)}",
                  file=sys.stderr)
        for row in res.dataset:
            hist = row["history"][-cfg.data.max_history_turns:]
            rows.append({**row, "history": hist})
    print(f"[peer-rl] {len(rows)} training prompt(s) from {root}", flush=True)
    return rows


def run(overrides: list[str]) -> Path:
    from peer_rl.controller import Controller
    from peer_rl.placement import PoolFactory

    cfg = load_config(overrides)
    out = Path(cfg.trainer.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    print(f"[peer-rl] recipe={cfg.recipe} experiment={cfg.experiment_name} output_dir={out}",
          flush=True)
    rows = load_prompts(cfg)
    policy, judge = resolve_models(cfg)
    t0 = time.perf_counter()
    init_ray(cfg)
    factory = PoolFactory(cfg, policy, judge)
    pools = None
    try:
        pools = factory.make_pools()
        print(f"[peer-rl] pools ready in {time.perf_counter() - t0:.0f} s: rollout x"
              f"{len(pools.rollout)}, reward_model x{len(pools.reward_model)}, actor x"
              f"{len(pools.actor)}, redundancy x{len(pools.redundancy)}", flush=True)
        steps = Controller(cfg, pools, rows, out).fit()
    finally:
        factory.shutdown(pools)
        import ray

        ray.shutdown()  # flush actor logs now, before the summary lines below
    print(f"[peer-rl] done: {steps} step(s); output in {out}", flush=True)
    return out
