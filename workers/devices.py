"""Which device a worker computes on: the devices of its own bundle, never a guess.

Why: Ray 2.60 no longer empties CUDA_VISIBLE_DEVICES for an actor that asked for no GPU
(`ray/_private/accelerators/nvidia_gpu.py` via RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO, off by
default), so such an actor sees every GPU of its node, and a worker that asks
`torch.cuda.is_available()` would put its encoder on `cuda:0` and faiss would copy its index
onto every GPU, into memory the engines and policy ranks own. The other way round, a pool given
GPUs on a node where CUDA does not work (a driver older than the torch wheel's CUDA) would fall
back to the CPU and gloo without a word. So the placement layer tells each actor its pool and
the GPUs its bundle holds (`pool_env`), and every worker asks `use_cuda()`:

- a pool with 0 GPUs computes on the CPU (and its CUDA_VISIBLE_DEVICES is emptied, so faiss
  and any library that looks for itself sees no GPU either);
- a pool with GPUs computes on the ones Ray made visible to it, or stops at start-up naming
  the pool when CUDA is not available there;
- outside a pool (in-process tests, benchmarks, the single-GPU check) wherever CUDA is.

No Ray import: the workers are plain classes.
"""
from __future__ import annotations

import os
import socket

POOL_ENV = "PEER_RL_POOL"     # "<pool>:<GPUs per worker>", set by the placement layer


class NoCudaError(RuntimeError):
    """A pool was given GPUs but CUDA does not work in its process."""


def pool_env(pool: str, gpus_per_worker: float) -> dict[str, str]:
    """The environment that tells an actor of `pool` what its bundle holds; a pool with no
    GPU also gets an empty CUDA_VISIBLE_DEVICES (Ray 2.60 leaves it as the node has it)."""
    env = {POOL_ENV: f"{pool}:{float(gpus_per_worker):g}"}
    if not gpus_per_worker:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def pool_gpus() -> tuple[str, float] | None:
    """(pool, GPUs per worker) of this process's pool, or None outside a pool."""
    spec = os.environ.get(POOL_ENV)
    if not spec:
        return None
    pool, _, gpus = spec.rpartition(":")
    try:
        return pool, float(gpus)
    except ValueError:
        raise ValueError(f"{POOL_ENV}={spec!r}: expected '<pool>:<GPUs per worker>'") from None


def use_cuda() -> bool:
    """Whether this process computes on CUDA (module docstring): its pool's GPUs decide; a
    pool given GPUs where CUDA is not available is an error naming the pool and what to check."""
    import torch  # deferred: torch (~2 s); the CLI starts without it

    mine = pool_gpus()
    if mine is None:
        return torch.cuda.is_available()
    pool, gpus = mine
    if not gpus:
        return False
    if not torch.cuda.is_available():
        raise NoCudaError(
            f"pool {pool!r} was given {gpus:g} GPU(s) a worker (resources.{pool}."
            f"gpus_per_worker), but CUDA is not available in its process on "
            f"{socket.gethostname()} (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda or 'none'}; CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}): check `nvidia-smi` and that "
            "the driver supports that CUDA version (docs/setup.md), or set "
            f"resources.{pool}.gpus_per_worker=0 to run the pool on CPUs")
    return True


def device() -> str:
    """"cuda" or "cpu" for this process (use_cuda)."""
    return "cuda" if use_cuda() else "cpu"
