"""Fault injection: a worker that SIGKILLs its own process inside a call, for chaos runs.

Killing an actor from outside can only guess when it is busy; a kill that lands between calls
tests a different path (Ray restarts the idle actor, nothing is retried). This hook makes the
process die at a chosen call, inside it, the way an OOM kill or a node failure would: the
death itself is real (SIGKILL, no Python clean-up), and so are Ray's restart, the worker
group's retry and everything after.

    PEER_RL_FAULTS="UnifiRewardWorker.score@2,RedundancyWorker.similarities@3x9"
    PEER_RL_FAULTS_DIR=/some/dir   (the call counters, on a file system every node sees;
                                    default: a new temporary directory of the driver's)

`Class.method@N` kills the process at the start of the N-th call of that method, counted over
all processes of the class (restarts included); `xK` repeats the death on the next K-1 calls
(`x9` outlasts any sensible trainer.max_actor_restarts). Unset, the classes are untouched; a
malformed spec is a start-up error naming it (exit 2).
"""
from __future__ import annotations

import fcntl
import functools
import logging
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

from peer_rl.errors import ConfigError

log = logging.getLogger(__name__)

ENV, DIR_ENV = "PEER_RL_FAULTS", "PEER_RL_FAULTS_DIR"


@dataclass(frozen=True)
class Fault:
    cls: str
    method: str
    call: int        # the first call (1-based, over all processes) that dies
    deaths: int = 1  # how many calls in a row die

    def dies(self, n: int) -> bool:
        return self.call <= n < self.call + self.deaths


def parse(spec: str) -> list[Fault]:
    """`Class.method@N[xK]`, comma-separated; a malformed entry is an error naming it."""
    faults = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        try:
            target, when = entry.split("@")
            cls, method = target.split(".")
            call, _, deaths = when.partition("x")
            fault = Fault(cls, method, int(call), int(deaths or 1))
        except ValueError:
            raise ConfigError(f"{ENV}: {entry!r} is not Class.method@N or Class.method@NxK") from None
        if fault.call < 1 or fault.deaths < 1 or not (cls.isidentifier() and method.isidentifier()):
            raise ConfigError(f"{ENV}: {entry!r}: N and K count from 1")
        faults.append(fault)
    return faults


def _counters_dir() -> Path:
    """Fixed once, in the driver, and carried to the workers inside the armed methods."""
    if not os.environ.get(DIR_ENV):
        os.environ[DIR_ENV] = tempfile.mkdtemp(prefix="peer-rl-faults-")
    return Path(os.environ[DIR_ENV])


def _count_call(directory: Path, key: str) -> int:
    """This call's number over all processes: a counter file under an exclusive lock."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{key}.calls", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read() or 0) + 1
        f.seek(0)
        f.truncate()
        f.write(str(n))
        f.flush()
        os.fsync(f.fileno())
        return n


def with_faults(cls: type) -> type:
    """`cls` itself, or (when PEER_RL_FAULTS names it) a subclass of the same name whose named
    methods may kill the process on entry. Called where the actor class is made (the driver):
    the fault and the counters' directory travel with the class, no environment needed."""
    mine = [f for f in parse(os.environ.get(ENV, "")) if f.cls == cls.__name__]
    if not mine:
        return cls
    directory = _counters_dir()

    def armed(fault: Fault):
        original = getattr(cls, fault.method)

        @functools.wraps(original)
        def method(self, *args, **kwargs):
            if fault.dies(_count_call(directory, f"{fault.cls}.{fault.method}")):
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, *args, **kwargs)
        return method

    for f in mine:
        if not callable(getattr(cls, f.method, None)):
            raise ConfigError(f"{ENV}: {cls.__name__} has no method {f.method!r}")
    log.warning(f"fault injection ({ENV}): " + ", ".join(
              f"{f.cls}.{f.method} dies on call {f.call}" + (f" and the next {f.deaths - 1}"
                                                              if f.deaths > 1 else "")
              for f in mine))
    # defined here, not in cls's module: Ray pickles it by value, so the workers get the
    # armed subclass and not the class their import of that module would find
    return type(cls.__name__, (cls,), {f.method: armed(f) for f in mine})
