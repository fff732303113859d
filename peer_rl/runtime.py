"""Connecting to Ray: one place for how every entry point (train, train-rm, sft) joins a cluster."""
from __future__ import annotations

import os
from pathlib import Path


# what keeps the workers' start-up out of the console (logging.verbose=false): transformers'
# weight-loading bars (one per model per actor), its advisories, Python warnings from libraries
# (and vLLM's, workers.vllm_engine), torch's C++ warnings (CPU NUMA binding notes)
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
             "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def _quiet_this_process() -> None:
    """The driver's share of QUIET_ENV (its interpreter has already read the environment)."""
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()


def init_ray(cfg, dashboard: bool = False) -> None:
    """Join `ray.address` (or start a local cluster). `dashboard`: a local cluster starts its
    dashboard too (bound to ray.dashboard_host), which serves Ray's state API: Ray Train's
    placement-group cleaner polls it and warns every few seconds when it is missing."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # "" = RAY_ADDRESS or a `ray start` cluster if one runs here, else a new local one;
    # "local" = always a new local cluster; anything else = that cluster's address
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS") or None
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    verbose = bool(getattr(getattr(cfg, "logging", None), "verbose", True))
    if not verbose:   # a key the job's own runtime env sets is left to it (Ray refuses both)
        env |= {k: v for k, v in QUIET_ENV.items() if k not in os.environ}
        _quiet_this_process()
    kwargs = {"address": address, "log_to_driver": True, "runtime_env": {"env_vars": env}}
    if address in (None, "local"):
        kwargs |= {"num_cpus": cfg.ray.num_cpus or os.cpu_count(), "include_dashboard": dashboard,
                   "dashboard_host": cfg.ray.dashboard_host}
    ray.init(**kwargs)


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB). On CPU a vLLM
    engine runs inside its worker's process, so a pool's figure includes its engine."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
