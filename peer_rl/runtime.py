"""Connecting to Ray: one place for how every entry point (train, train-rm, sft) joins a cluster."""
from __future__ import annotations

import os
from pathlib import Path


def init_ray(cfg) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # "" = RAY_ADDRESS or a `ray start` cluster if one runs here, else a new local one;
    # "local" = always a new local cluster; anything else = that cluster's address
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS") or None
    kwargs = {"address": address, "log_to_driver": True,
              "runtime_env": {"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}}}
    if address in (None, "local"):
        kwargs |= {"num_cpus": cfg.ray.num_cpus or os.cpu_count(), "include_dashboard": False,
                   "dashboard_host": cfg.ray.dashboard_host}
    ray.init(**kwargs)
