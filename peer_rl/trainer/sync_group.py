"""The driver's side of policy -> rollout weight sync: it forms the group and passes metadata.

Policy rank 0 and every rollout-engine worker (tensor-parallel workers included) form one
process group (peer_rl.workers.weight_sync); the weights go from rank 0 straight to the engines, bucket
by bucket. The driver only asks for the tensor list once, hosts nothing and moves no weight.
The group is formed before the first sync and again after any engine restart (a restarted
engine is a new process that holds the initial checkpoint), then the whole pool is sent to.

A sync that cannot complete ends in bounded time on NCCL as on gloo: every member gives each
bucket at most actor.weight_sync_timeout_s (peer_rl.workers.weight_sync.finish). An engine that has not
come back from its receive by then, plus a grace period, is taken for hung: it is named, ended
and restarted by Ray like a crashed one, and the sync is repeated; past
trainer.max_actor_restarts the run stops (exit 3) with the last checkpoint standing.
"""
from __future__ import annotations

import logging
from typing import Callable

import ray

from peer_rl.trainer.worker_group import WorkerGroupFailed

log = logging.getLogger(__name__)


class WeightSyncGroup:
    """`sync()` after every update; `invalidate()` whenever an engine may have restarted."""

    def __init__(self, policy_call: Callable, engines: Callable[[], list],
                 wait_alive: Callable[[int], object], tensor_parallel_size: int = 1,
                 bucket_mb: float = 256.0, max_retries: int = 1, timeout_s: float = 300.0):
        self.policy_call, self.engines, self.wait_alive = policy_call, engines, wait_alive
        self.tp, self.max_retries = tensor_parallel_size, max_retries
        # an engine's last bucket ends at most timeout_s after the policy's; the grace covers
        # loading it (30 s, less for a short test timeout)
        self.timeout_s, self.grace_s = timeout_s, min(30.0, max(5.0, timeout_s))
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.metas: list | None = None
        self.formed = False
        self.syncs = 0
        self.recoveries = 0     # engines found dead during a sync and waited for
        self._calls: list = []  # this attempt's engine calls in flight, one per engine

    def invalidate(self) -> None:
        self.formed = False

    def _form(self) -> None:
        engines = self.engines()
        if self.metas is None:   # what the engines hold their weights in is what is sent
            dtype = self._answers([engines[0].engine_dtype.remote()], "engine_dtype")[0]
            self.metas = self.policy_call("weight_metas", dtype)[0]
            # a LoRA policy whose engines serve base + adapter sends its adapters alone
            self.adapter_config = self.policy_call("adapter_config")[0]
        world = 1 + len(engines) * self.tp
        addr, port = self.policy_call("host_weight_sync", world, self.timeout_s)[0]
        joins = [e.join_weight_sync.remote(addr, port, 1 + i * self.tp, world, self.metas,
                                           self.bucket_bytes, self.adapter_config,
                                           self.timeout_s)
                 for i, e in enumerate(engines)]
        self._calls = joins
        self.policy_call("join_weight_sync")
        self._answers(joins, "join_weight_sync")
        self.formed = True

    def _answers(self, refs: list, what: str) -> list:
        """The engines' answers to `refs` (one call per engine, in order), each given
        timeout_s plus the grace period: an engine that is alive but never answers (stopped,
        or stuck in a collective) would otherwise hold the driver forever."""
        self._calls = refs
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s + self.grace_s)
        if pending:
            raise EnginesHung(f"the rollout engines did not all answer {what}")
        return ray.get(refs)

    def sync(self, version: int | None = None) -> dict:
        """Send the policy's current weights to every engine; returns {"bytes", "seconds"}.
        `version` (the policy's update count) is what the engines stamp on their samples.
        An engine that dies during the sync is waited for (Ray restarts it), the group is formed
        again and the sync repeated, up to `max_retries` times."""
        for attempt in range(self.max_retries + 1):
            self._calls = []
            try:
                if not self.formed:
                    self._form()
                self._calls = [e.receive_weights.remote(version) for e in self.engines()]
                sent = self.policy_call("send_weights", self.metas, self.bucket_bytes)[0]
                # sent is not received: a stopped engine can leave the last bucket in the
                # sockets' buffers under gloo, so the engines' own calls are bounded too
                self._answers(self._calls, "receive_weights")
                self.syncs += 1
                return sent
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError,
                    EnginesHung) as exc:
                # engines still in a receive the policy gave up on get a bucket's time to end
                hung = self._end_hung(self._calls, 0.0 if isinstance(exc, EnginesHung)
                                      else self.timeout_s + self.grace_s)
                if attempt == self.max_retries:
                    raise WorkerGroupFailed(
                        f"weight sync failed {attempt + 1} time(s) "
                        f"(trainer.max_actor_restarts={self.max_retries}): {_first_line(exc)}"
                        f"{hung}. The last complete checkpoint stands; rerun with resume=auto"
                    ) from None
                log.warning(f"weight sync interrupted ({type(exc).__name__}){hung}; waiting "
                            "for the rollout engines, forming the group again")
                self.formed = False
                self.recoveries += 1
                for i in range(len(self.engines())):
                    self.wait_alive(i)
        raise AssertionError("unreachable")

    def _end_hung(self, refs: list, wait_s: float) -> str:
        """After a failed sync: the engines whose call has not returned within `wait_s` are
        hung (stopped, or waiting on a peer that is gone: under NCCL nothing else would end
        them); each is named and killed so that Ray restarts it. Returns the words naming them
        for the error line ("" when none)."""
        if not refs:
            return ""
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        hung = [i for i, ref in enumerate(refs) if ref in pending]
        for i in hung:
            ray.kill(self.engines()[i], no_restart=False)
        if not hung:
            return ""
        return (": rollout engine(s) " + ", ".join(map(str, hung)) + " did not answer within "
                f"actor.weight_sync_timeout_s={self.timeout_s:g} s and were restarted")


class EnginesHung(RuntimeError):
    """Engines that have not answered a sync's call well after they should have."""


def _first_line(exc: BaseException) -> str:
    """A Ray error's own first line (its traceback follows)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
