"""Connecting to Ray: one place for how every entry point (train, train-rm, sft) joins a cluster."""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

log = logging.getLogger(__name__)


# what keeps the workers' start-up out of the console (logging.verbose=false): transformers'
# weight-loading bars (one per model per actor), its advisories, Python warnings from libraries
# (and vLLM's, peer_rl.workers.vllm_engine), torch's C++ warnings (CPU NUMA binding notes)
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
             "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def quiet_driver() -> None:
    """The driver's share of QUIET_ENV (its interpreter has already read the environment):
    no library deprecation notes, no weight-writing bars, no notice that the local cluster
    uses token authentication. peer-rl's own lines and bars, and every warning, stay."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    from huggingface_hub.utils import disable_progress_bars  # deferred: huggingface_hub
    from transformers.utils import logging as hf_logging  # deferred: transformers

    disable_progress_bars()
    hf_logging.disable_progress_bar()          # its flag was read at import: set it as well
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(
        logging.ERROR)
    # "Started a local Ray instance": init_ray says so in its own line, with the dashboard
    logging.getLogger("ray._private.worker").setLevel(logging.WARNING)


def init_ray(cfg, dashboard: bool = False) -> None:
    """Join `ray.address` (or start a local cluster). `dashboard`: a local cluster starts its
    dashboard too (bound to ray.dashboard_host), which serves Ray's state API: Ray Train's
    placement-group cleaner polls it and warns every few seconds when it is missing."""
    import ray  # deferred: ray (~1 s); commands that start no cluster run without it

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # "" = RAY_ADDRESS (set by `ray job submit`) if given, else a new local cluster of this
    # run's own: never a cluster someone else started here (Ray's address=None would join a
    # `ray start` cluster found on the machine); "auto" = that one; anything else = its address
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS") or "local"
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    verbose = bool(getattr(getattr(cfg, "logging", None), "verbose", True))
    if not verbose:   # a key the job's own runtime env sets is left to it (Ray refuses both)
        env |= {k: v for k, v in QUIET_ENV.items() if k not in os.environ}
        quiet_driver()
    kwargs = {"address": address, "log_to_driver": True, "runtime_env": {"env_vars": env}}
    if address == "local":
        kwargs |= {"num_cpus": cfg.ray.num_cpus or os.cpu_count(), "include_dashboard": dashboard,
                   "dashboard_host": cfg.ray.dashboard_host}
    ctx = ray.init(**kwargs)
    how = "started a local Ray cluster" if address == "local" else f"joined Ray at {address}"
    board = f", dashboard http://{ctx.dashboard_url}" if ctx.dashboard_url else ""
    log.info(f"{how} (GCS {ctx.address_info.get('gcs_address', '?')}{board})")
