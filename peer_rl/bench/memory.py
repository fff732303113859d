"""`peer-rl bench memory RUN_DIR [RUN_DIR ...] --baseline RUN_DIR`: `plan`'s per-worker memory
arithmetic held against the peak resident memory finished runs measured (their memory.json).

The estimate is peer_rl.planning.memory's, on the CPU (each pool in the dtype its run computed
in, as memory.json records it: float32 for runs older than the setting; no CUDA context; each
CPU engine's KV cache as the run sized it), plus each pool's process footprint before any model
(Python, torch, Ray's worker, vLLM's engine), which no shape arithmetic gives: it is taken from
the `--baseline` run (the tiny recipe: its models weigh a few MB) as its measured peak less its
own estimate, and then held fixed. The baseline run's ratios are 1 by construction; the other
runs' ratios are the check.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import psutil
import yaml

from peer_rl.compute.activation_memory import GiB
from peer_rl.compute.precision import BYTES
from peer_rl.config.reward_kinds import reward_kind
from peer_rl.config.schema import load_config
from peer_rl.errors import ConfigError
from peer_rl.files.out_paths import DamagedFile, read_json
from peer_rl.planning import memory
from peer_rl.planning.shapes import model_shape

PARSES_ITS_ARGS = True
POOLS = ("rollout", "reward_model", "actor", "redundancy", "retrieval")


def model_parts(run_dir: Path, dtypes: dict[str, str]) -> tuple[dict[str, dict[str, int]], str]:
    """(pool -> the bytes a worker of it holds for its model, by part (CPU arithmetic), each
    pool computing in dtypes[pool] (float32 where absent); what the run's policy ranks
    allocated with)."""
    from peer_rl.trainer.resource_pools import PoolFactory  # deferred: pulls in ray, torch
    # deferred: tests patch load_prompts
    from peer_rl.trainer.run import load_prompts, measured_prompts, resolve_models

    dtype = {pool: dtypes.get(pool, "float32") for pool in ("actor", "rollout", "reward_model")}
    cfg = load_config([f"recipe={run_dir / 'config.yaml'}"]
                      + [f"{pool}.dtype={d}" for pool, d in dtype.items()])
    policy, judge = resolve_models(cfg)
    factory = PoolFactory(cfg, policy, judge, "", measured_prompts(cfg, load_prompts(cfg), policy))
    p_config, p_params, p_vision, _ = model_shape(policy)
    host_gib = psutil.virtual_memory().total / GiB
    rank = memory.policy_rank(p_config, p_params, p_vision, cfg.actor, cfg.model.lora,
                              host_gib / cfg.actor.world_size,
                              device=memory.cpu_device(dtype["actor"]))
    out = {"actor": rank.parts,
           "rollout": memory.cpu_engine("rollout", p_params,
                                        factory.engine_settings("rollout").kv_cache_gib,
                                        memory.cpu_device(dtype["rollout"])).parts}
    kind = reward_kind(cfg.reward_model.kind)
    if kind.writes and len(kind.models) == 1:        # one vLLM judge engine
        out["reward_model"] = memory.cpu_engine(
            "reward_model", model_shape(judge)[1],
            factory.engine_settings("reward_model").kv_cache_gib,
            memory.cpu_device(dtype["reward_model"])).parts
    # a run saved before the key existed ran with glibc's own threshold (the default now is 4)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    mib = (saved.get("actor") or {}).get("malloc_mmap_threshold_mib", 0)
    return out, (f"glibc mmap threshold {mib:g} MiB" if mib else "glibc's own mmap threshold")


def measured(path: Path) -> tuple[dict[str, float], dict[str, str]]:
    """A run's memory.json (peer_rl.trainer.controller writes it) as (pool -> its largest
    worker's peak GiB, pool -> the dtype it computed in); one that is not the controller's shape
    is named with the key that is wrong (DamagedFile)."""
    report = read_json(path, "memory report")

    def damaged(key: str, expected: str, found) -> DamagedFile:
        return DamagedFile(f"{path}: {key}: expected {expected}, found {found!r}; rerun the "
                           "training run that writes it")

    if not isinstance(report, dict):
        raise damaged("the top level", "an object with peak_rss_gib", report)
    if "peak_rss_gib" not in report:
        raise DamagedFile(f"{path}: no peak_rss_gib; rerun the training run that writes it")
    peaks, dtypes = report["peak_rss_gib"], report.get("dtype", {})
    if not isinstance(peaks, dict) or not peaks:
        raise damaged("peak_rss_gib", "an object of pool -> GiB per worker", peaks)
    for pool, values in peaks.items():
        if not isinstance(values, list) or not values or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and v > 0 for v in values):
            raise damaged(f"peak_rss_gib.{pool}", "a list of positive GiB, one per worker",
                          values)
    if not isinstance(dtypes, dict):
        raise damaged("dtype", "an object of pool -> the dtype it computed in", dtypes)
    for pool, name in dtypes.items():
        if name not in BYTES:
            raise damaged(f"dtype.{pool}", f"one of {', '.join(BYTES)}", name)
    return {pool: float(max(v)) for pool, v in peaks.items()}, dtypes


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="peer-rl bench memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="output directories of finished runs (memory.json)")
    ap.add_argument("--baseline", required=True,
                    help="a run whose models weigh next to nothing (the tiny recipe's): each "
                         "pool's process footprint is its measured peak less its estimate")
    args = ap.parse_args(argv)

    for run in [args.baseline, *args.runs]:
        missing = [f for f in ("config.yaml", "memory.json") if not (Path(run) / f).is_file()]
        if missing:
            raise ConfigError(f"{run}: not a finished `peer-rl train` output directory (no "
                              f"{' and no '.join(missing)})")
    # every report read before the first line is printed: a damaged one is named, alone
    reports = {Path(run): measured(Path(run) / "memory.json")
               for run in [args.baseline, *args.runs]}
    base_dir = Path(args.baseline)
    base_peak, base_dtypes = reports[base_dir]
    base_parts, _ = model_parts(base_dir, base_dtypes)
    footprint = {pool: base_peak[pool] - sum(base_parts[pool].values()) / GiB
                 for pool in base_parts if pool in base_peak}
    print("process footprint per pool (GiB, from the baseline run): "
          + ", ".join(f"{p} {v:.2f}" for p, v in footprint.items()))
    print(f"\n{'run':28s} {'pool':13s} {'model parts GiB':>16s} {'estimate':>9s} "
          f"{'measured':>9s} {'ratio':>6s}  parts")
    worst = 0.0
    for run in [base_dir, *map(Path, args.runs)]:
        peak, dtypes = reports[run]
        parts, allocator = model_parts(run, dtypes)
        for pool in (p for p in POOLS if p in parts and p in peak and p in footprint):
            model = sum(parts[pool].values()) / GiB
            estimate = model + footprint[pool]
            ratio = estimate / peak[pool]
            if run != base_dir:
                worst = max(worst, abs(ratio - 1))
            detail = ", ".join(f"{k} {v / GiB:.2f}" for k, v in parts[pool].items() if v)
            if pool == "actor":
                detail += f" ({allocator})"
            print(f"{run.name[:28]:28s} {pool:13s} {model:16.2f} {estimate:9.2f} "
                  f"{peak[pool]:9.2f} {ratio:6.2f}  {detail}")
    print(f"\nlargest |estimate / measured - 1| outside the baseline run: {100 * worst:.0f}%")
    return 0
