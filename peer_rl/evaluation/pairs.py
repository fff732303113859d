"""`peer-rl eval pairs`: a scalar reward model's pairwise accuracy on held-out preference pairs,
scored by the same vLLM pooling engine the ESCRAG-R1 reward pool serves it with."""
from __future__ import annotations

import json
import time
from pathlib import Path

from peer_rl.config.worker_settings import JudgeSettings
from peer_rl.files.out_paths import write_atomic
from peer_rl.protocol import ScalarItem
from peer_rl.supervised.bradley_terry import pairwise_accuracy


def evaluate_pairs(root, model: str, out: str | Path, files: str = "test",
                   kv_cache_gib: float = 1.0, max_model_len: int = 4096, limit: int = 0) -> dict:
    from peer_rl.data.loading import load_subset  # deferred: pulls in datasets
    # deferred: tests patch ScalarRewardWorker
    from peer_rl.workers.scalar_reward import ScalarRewardWorker

    rows = [dict(r) for r in load_subset(root, "preference", files).dataset]
    rows = rows[:limit] if limit else rows
    t0 = time.perf_counter()
    worker = ScalarRewardWorker(
        model, JudgeSettings(kv_cache_gib=kv_cache_gib, max_model_len=max_model_len))
    try:
        items = [ScalarItem(r["history"], r[k], r["language"]) for r in rows
                 for k in ("chosen", "rejected")]
        scores = worker.score(items)
    finally:
        worker.close()
    chosen, rejected = scores[0::2], scores[1::2]
    report = {"model": model, "pairs": len(rows), "seconds": time.perf_counter() - t0,
              "pairwise_accuracy": pairwise_accuracy(chosen, rejected),
              "mean_margin": sum(c - r for c, r in zip(chosen, rejected)) / max(len(rows), 1),
              "by_language": {}}
    for lang in sorted({r["language"] for r in rows}):
        idx = [i for i, r in enumerate(rows) if r["language"] == lang]
        report["by_language"][lang] = {
            "pairs": len(idx),
            "pairwise_accuracy": pairwise_accuracy([chosen[i] for i in idx],
                                                   [rejected[i] for i in idx])}

    write_atomic(out, json.dumps(report, indent=1))
    return report
