"""The driver's side of policy -> rollout weight sync: it forms the group and passes metadata.

Policy rank 0 and every rollout-engine worker (tensor-parallel workers included) form one
process group (workers.weight_sync); the weights go from rank 0 straight to the engines, bucket
by bucket. The driver only asks for the tensor list once, hosts nothing and moves no weight.
The group is formed before the first sync and again after any engine restart (a restarted
engine is a new process that holds the initial checkpoint), then the whole pool is sent to.
"""
from __future__ import annotations

import sys
from typing import Callable

import ray

from peer_rl.trainer.worker_group import WorkerGroupFailed


class WeightSyncGroup:
    """`sync()` after every update; `invalidate()` whenever an engine may have restarted."""

    def __init__(self, policy_call: Callable, engines: Callable[[], list],
                 wait_alive: Callable[[int], object], tensor_parallel_size: int = 1,
                 bucket_mb: float = 256.0, max_retries: int = 1):
        self.policy_call, self.engines, self.wait_alive = policy_call, engines, wait_alive
        self.tp, self.max_retries = tensor_parallel_size, max_retries
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.metas: list | None = None
        self.formed = False
        self.syncs = 0
        self.recoveries = 0     # engines found dead during a sync and waited for

    def invalidate(self) -> None:
        self.formed = False

    def _form(self) -> None:
        engines = self.engines()
        if self.metas is None:   # what the engines hold their weights in is what is sent
            dtype = ray.get(engines[0].engine_dtype.remote())
            self.metas = self.policy_call("weight_metas", dtype)[0]
            # a LoRA policy whose engines serve base + adapter sends its adapters alone
            self.adapter_config = self.policy_call("adapter_config")[0]
        world = 1 + len(engines) * self.tp
        addr, port = self.policy_call("host_weight_sync", world)[0]
        joins = [e.join_weight_sync.remote(addr, port, 1 + i * self.tp, world, self.metas,
                                           self.bucket_bytes, self.adapter_config)
                 for i, e in enumerate(engines)]
        self.policy_call("join_weight_sync")
        ray.get(joins)
        self.formed = True

    def sync(self, version: int | None = None) -> dict:
        """Send the policy's current weights to every engine; returns {"bytes", "seconds"}.
        `version` (the policy's update count) is what the engines stamp on their samples.
        An engine that dies during the sync is waited for (Ray restarts it), the group is formed
        again and the sync repeated, up to `max_retries` times."""
        for attempt in range(self.max_retries + 1):
            try:
                if not self.formed:
                    self._form()
                refs = [e.receive_weights.remote(version) for e in self.engines()]
                sent = self.policy_call("send_weights", self.metas, self.bucket_bytes)[0]
                ray.get(refs)
                self.syncs += 1
                return sent
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                if attempt == self.max_retries:
                    raise WorkerGroupFailed(
                        f"weight sync failed {attempt + 1} time(s) "
                        f"(trainer.max_actor_restarts={self.max_retries}): {exc}. The last "
                        "complete checkpoint stands; rerun with resume=auto") from None
                print(f"[peer-rl] weight sync interrupted ({type(exc).__name__}); waiting for the "
                      "rollout engines, forming the group again", file=sys.stderr, flush=True)
                self.formed = False
                self.recoveries += 1
                for i in range(len(self.engines())):
                    self.wait_alive(i)
        raise AssertionError("unreachable")
