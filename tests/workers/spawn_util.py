"""Rank processes for the FSDP2 tests, forked from a warm interpreter instead of started cold.

`mp.spawn` starts every rank as a fresh interpreter that imports torch, transformers, peer_rl and
the test module again (~8-9 s on 2 cores) for a few seconds of work. Here the ranks come from
multiprocessing's forkserver: one interpreter, started on the first call, that imports those
modules once (PRELOAD and the caller's module); each rank is a fork of it. The ranks are still
separate processes, each in its own gloo process group, as with spawn: a fresh fork per rank and
per run, nothing carried over from an earlier run but the imported modules.

What differs from spawn and is put back here: a fork inherits the forkserver's environment from
when it started, so each rank takes the caller's os.environ at the time of the call
(multiprocessing itself sends sys.path and the working directory). What is not put back: a
variable a module reads when it is imported (torch, transformers) keeps the value it had when
the forkserver started.

The forkserver is one per pytest process and stays up (~0.9 GB resident) until pytest exits;
`multiprocessing.set_forkserver_preload` only takes effect if it is not running yet. If
something else started it first, the ranks import what it lacks themselves: correct, only
slower (tests/workers/test_spawn_util.py fails then).

A rank's peak resident memory (ru_maxrss, perf/max_rss_gib) is its own process's, as before, but
lower than a spawned rank's (~0.56 GiB against ~0.87 GiB for the tiny model's "train" run): a
fork does not count the import's transient allocations, nor a shared library's pages until it
touches them.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
from multiprocessing import forkserver

import torch.multiprocessing as mp

# modules a rank imports anyway, most of them deferred (they load on first use in the worker):
# imported once in the forkserver instead of in every rank
PRELOAD = [
    "torch", "torch.distributed.fsdp", "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict", "torch.distributed.tensor",
    "transformers", "transformers.models.qwen2.modeling_qwen2",
    "peft", "safetensors.torch",
    "peer_rl.workers.policy", "peer_rl.workers.lora", "peer_rl.workers.fsdp",
    # the vision-language policy: its model, and what AutoProcessor loads for it
    "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
    "transformers.models.auto.processing_auto", "transformers.models.auto.video_processing_auto",
    "transformers.models.qwen2_vl.processing_qwen2_vl",
    "transformers.models.qwen2_vl.image_processing_qwen2_vl",
    "transformers.models.qwen2_vl.video_processing_qwen2_vl",
    "transformers.tokenization_mistral_common", "peer_rl.workers.vision", "peer_rl.data.bundled",
    __name__,
]
IMPORTED_BY = os.getpid()     # in a rank, the forkserver's pid: the module came with the fork


def start_ranks(fn, args: tuple, nprocs: int) -> None:
    """Run fn(rank, *args) for rank 0..nprocs-1, each in a process of its own forked from the
    warm forkserver, and wait for all of them; a rank's exception is raised here
    (torch.multiprocessing.ProcessRaisedException), as mp.spawn does. `fn` must be a module-level
    function of a module the forkserver can import (its folder on sys.path: pytest puts a test
    file's folder there)."""
    folders = {os.path.dirname(os.path.abspath(sys.modules[m].__file__))
               for m in (__name__, fn.__module__)}
    _start_forkserver([*PRELOAD, fn.__module__], sorted(folders))
    mp.start_processes(_with_environ, args=(fn, dict(os.environ), args), nprocs=nprocs,
                       join=True, start_method="forkserver")


def _start_forkserver(preload: list[str], folders: list[str]) -> None:
    """Start the forkserver with `preload` imported, unless it is running already. Python
    3.11's forkserver is handed the caller's sys.path but never applies it: it imports its
    preload on the default path and PYTHONPATH, and skips a module it cannot find without a
    word (the test folders, which only pytest puts on sys.path). So the folders of the modules
    go to it on PYTHONPATH, for its start only."""
    multiprocessing.set_forkserver_preload(preload)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([*folders, *([before] if before else [])])
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def _with_environ(rank: int, fn, environ: dict, args: tuple) -> None:
    """In the rank: the caller's environment, then fn."""
    os.environ.clear()
    os.environ.update(environ)
    fn(rank, *args)
