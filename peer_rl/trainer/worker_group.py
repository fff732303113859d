"""The controller's runtime: one object per pool of Ray actors, so the controller reads as the
GRPO loop alone.

`WorkerGroup` fans a stateless pool (rollout, reward model, redundancy, retrieval) out. A call
names the method; how it is split and gathered is what the worker class declares on it
(peer_rl.protocol.dispatch: SHARD gives each worker its chunk and gathers the answers in item
order, ONE gives the whole call to the first worker). A worker that dies mid-call is
restarted by Ray (`max_restarts`); the group waits for it, runs its hooks' `on_restart` (the
rollout pool re-syncs the policy's weights into the new engine) and redoes only that worker's
chunk, so a retried step counts once. `check` may reject a result that a restarted worker gave
(an engine restarted while idle answers from the initial checkpoint); it is retried the same way.
A stateless worker restarted while idle answers correctly; `identity` (its process id, read off
the result) still lets the group count that restart. What a group asks of the run around it is
one `GroupHooks` object with a named method per question; the controller subclasses it.
`PolicyGroup` calls every FSDP rank together: a dead rank cannot be worked around (the
collective is broken), so the survivors are killed rather than left hanging and the step fails
with `PolicyGroupFailed`, naming the checkpoint to resume from.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ray

from peer_rl.protocol import Dispatch, dispatch_of, gather, shard

log = logging.getLogger(__name__)


@dataclass
class Pools:
    """Ray actor handles, one list per pool (peer_rl.trainer.resource_pools.PoolFactory.make_pools)."""
    rollout: list
    reward_model: list
    actor: list                      # FSDP2 ranks, rank 0 first
    redundancy: list = field(default_factory=list)
    retrieval: list = field(default_factory=list)
    seeker: list = field(default_factory=list)      # the simulated seeker (dialogue.enable)
    restart: object = None           # callable(pool_name, index) -> new handle (fault tolerance)
    classes: dict = field(default_factory=dict)   # pool name -> its worker class (dispatch modes)


class PoolFailed(RuntimeError):
    """A pool cannot go on: the run stops, its last complete checkpoint stands."""


class PolicyGroupFailed(PoolFailed):
    """A policy rank died: the FSDP group cannot continue; resume from the last checkpoint."""


class WorkerGroupFailed(PoolFailed):
    """A worker died more often than trainer.max_actor_restarts allows, or did not come back."""


def _resume_hint(last_checkpoint: Callable[[], Path | None] | None) -> str:
    ckpt = last_checkpoint() if last_checkpoint is not None else None
    return (f"Last complete checkpoint: {ckpt if ckpt else 'none'}. "
            "Rerun with resume=auto to continue from it.")


class WorkerRestarted(RuntimeError):
    """A worker answered as a freshly started one would: it was restarted between calls."""


class GroupHooks:
    """What a worker group asks of the run it serves. These defaults are a group on its own (a
    test): step 0, no checkpoint, no replacement, nothing redone after a restart, every answer
    accepted, restarts between calls not counted."""

    def step(self) -> int:
        """The step in progress, as the group's messages name it."""
        return 0

    def last_checkpoint(self) -> Path | None:
        """Where a failed run resumes from, named in the error."""
        return None

    def replace(self, pool: str, i: int):
        """A new handle for worker i of `pool` once Ray has given up restarting it; None: it
        cannot be replaced and the run stops."""
        return None

    def on_restart(self, i: int) -> None:
        """Worker i came back from a crash; called before its chunk is redone."""

    def check(self, i: int, method: str, result) -> None:
        """Raise WorkerRestarted to refuse `result`, worker i's answer to `method`."""

    def identity(self, result):
        """The process that gave `result`, so a restart between calls is counted; None: not
        read."""
        return None


class WorkerGroup:
    def __init__(self, name: str, handles: list, max_restarts: int, recovery_timeout_s: float,
                 hooks: GroupHooks | None = None, cls: type | None = None):
        self.name, self.handles = name, handles        # the list Pools holds: kept in sync
        self.cls = cls                                 # the worker class: its dispatch modes
        self.hooks = hooks or GroupHooks()
        self.max_restarts, self.recovery_timeout_s = max_restarts, recovery_timeout_s
        self.seen: dict = {}                           # worker -> the process that answered last
        self.restarts = 0                              # workers recovered, cumulative

    def __len__(self) -> int:
        return len(self.handles)

    def map(self, method: str, chunks: list, *args, step: int | None = None) -> list:
        """`method(chunk, *args)` on each worker with a non-empty chunk; results in order.
        `step`: the step the call works for, as messages name it (default: the group's)."""
        step = self.hooks.step() if step is None else step
        refs = {i: getattr(h, method).remote(c, *args)
                for i, (h, c) in enumerate(zip(self.handles, chunks)) if c}
        out: dict[int, object] = {}
        for i, ref in refs.items():
            for attempt in range(self.max_restarts + 1):
                try:
                    result = ray.get(ref)
                    self.hooks.check(i, method, result)
                    out[i] = result
                    self._note_identity(i, result, recovered=attempt > 0)
                    break
                except (ray.exceptions.RayActorError, WorkerRestarted) as exc:
                    if attempt == self.max_restarts:
                        raise WorkerGroupFailed(
                            f"{self.name} worker {i} failed {attempt + 1} time(s) in step "
                            f"{step} (trainer.max_actor_restarts={self.max_restarts}); "
                            f"giving up ({type(exc).__name__}). "
                            + _resume_hint(self.hooks.last_checkpoint)) from None
                    what = ("was restarted between calls" if isinstance(exc, WorkerRestarted)
                            else f"died during step {step}")
                    log.warning(f"{self.name} worker {i} {what} ({type(exc).__name__}); "
                                "retrying its chunk")
                    self.restarts += 1
                    handle = self.wait_alive(i)
                    self.hooks.on_restart(i)
                    ref = getattr(handle, method).remote(chunks[i], *args)
        return [out[i] for i in sorted(out)]

    def _note_identity(self, i: int, result, recovered: bool) -> None:
        """Count a restart the call did not see (the worker died while idle)."""
        who = self.hooks.identity(result)
        if who is None:
            return
        if not recovered and i in self.seen and self.seen[i] != who:
            self.restarts += 1
            log.warning(f"{self.name} worker {i} was restarted between calls; its answer "
                        "stands (the worker keeps no state)")
        self.seen[i] = who

    def call(self, method: str, items, *args, step: int | None = None):
        """`method(items, *args)` split and gathered as the worker class declares it."""
        if dispatch_of(self.cls, method) is Dispatch.ONE:
            return self.map(method, [items], *args, step=step)[0]
        return gather(self.map(method, shard(items, len(self)), *args, step=step))

    def wait_alive(self, i: int):
        """Ray restarts a crashed actor (max_restarts); wait until it answers. Past its restarts
        the actor is replaced if the placement layer can."""
        deadline = time.monotonic() + self.recovery_timeout_s
        while True:
            handle = self.handles[i]
            try:
                ray.get(handle.health.remote(), timeout=60)
                return handle
            except ray.exceptions.ActorDiedError as exc:
                handle = self.hooks.replace(self.name, i)
                if handle is None:
                    raise WorkerGroupFailed(f"{self.name} worker {i} died and cannot be "
                                            f"restarted: {exc}. "
                                            + _resume_hint(self.hooks.last_checkpoint)) from None
                self.handles[i] = handle
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
            if time.monotonic() > deadline:
                raise WorkerGroupFailed(f"{self.name} worker {i} did not come back within "
                                        f"{self.recovery_timeout_s:.0f} s "
                                        "(trainer.recovery_timeout_s). "
                                        + _resume_hint(self.hooks.last_checkpoint))
            time.sleep(2.0)

    def health(self) -> list[dict]:
        return ray.get([h.health.remote() for h in self.handles])


class PolicyGroup:
    """The policy's ranks: every call goes to all of them together (methods declared
    Dispatch.ALL on `cls`)."""

    def __init__(self, handles: list, cls: type, last_checkpoint: Callable[[], Path | None],
                 step: Callable[[], int] = lambda: 0):
        self.handles, self.cls = handles, cls
        self.last_checkpoint, self.step = last_checkpoint, step

    def __len__(self) -> int:
        return len(self.handles)

    def call(self, method: str, *args) -> list:
        """All ranks, together; a dead rank ends the run (no partial state)."""
        return self.collect(self.submit(method, *args))

    def submit(self, method: str, *args) -> list:
        if dispatch_of(self.cls, method) is not Dispatch.ALL:
            raise TypeError(f"{self.cls.__name__}.{method} is not declared Dispatch.ALL: the "
                            "policy's ranks must all take part in each call")
        return [getattr(a, method).remote(*args) for a in self.handles]

    def collect(self, refs: list) -> list:
        """Results are collected as they finish so that a dead rank is seen at once, not after
        the survivors time out in a collective; the survivors are then killed."""
        pending, results = list(refs), {}
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                results[ready[0]] = ray.get(ready[0])
        except ray.exceptions.RayActorError as exc:
            for a in self.handles:
                ray.kill(a, no_restart=True)
            raise PolicyGroupFailed(
                f"a policy rank died during step {self.step()} ({type(exc).__name__}); the "
                "FSDP group cannot continue. " + _resume_hint(self.last_checkpoint)) from None
        return [results[r] for r in refs]
