"""Policy -> rollout-engine weight sync over a collective: a process group of its own, buckets.

Why a collective: gathering the full state dict on one rank, serialising it and passing it
through Ray's object store moves every byte through the head node two or three times (~16 GB a
step for an 8B policy in fp16). Here policy rank 0 and every engine worker form one process
group (NCCL on GPU, gloo on CPU) beside their own; tensors go out in flat buffers of about
`actor.weight_sync_bucket_mb`, in the dtype the engines hold, and each bucket is loaded into the
engine as it arrives. The driver passes only the tensor list (names, shapes, dtypes) and the
rendezvous address, so no weight ever passes through it. verl and OpenRLHF sync the same way.

The group is built from a TCPStore and a backend object directly, not registered with
torch.distributed's global state: the policy process already has its FSDP group as the default
one and the engine its own, and either may need to leave and rejoin (an engine restarted by Ray
joins a freshly built group; the old one is dropped).

No Ray import: the policy worker, the vLLM worker extension and the benchmarks share it.
"""
from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.distributed as dist

ALIGN = 64   # bytes: every tensor starts aligned in its bucket, so a view of any dtype is valid
# NCCL's watchdog ends the process when a collective outlives the group's own timeout
# (TORCH_NCCL_ASYNC_ERROR_HANDLING's default); the group is given this much longer than a
# bucket's, so `finish` aborts the communicator and raises first
WATCHDOG_MARGIN_S = 60.0


class SyncTimeout(RuntimeError):
    """A bucket of the weight sync did not complete in time: a member stopped taking part."""


@dataclass(frozen=True)
class TensorMeta:
    """One tensor of the sync: its checkpoint (HF) name, shape and dtype (torch name)."""
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


def plan_buckets(metas: list[TensorMeta], bucket_bytes: int) -> list[list[int]]:
    """Consecutive tensors grouped so that a bucket holds at most `bucket_bytes` (with
    alignment); a tensor larger than that travels alone. Both ends compute the same plan."""
    buckets, cur, size = [], [], 0
    for i, m in enumerate(metas):
        need = _aligned(m.nbytes)
        if cur and size + need > bucket_bytes:
            buckets.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += need
    if cur:
        buckets.append(cur)
    return buckets


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _offsets(metas: list[TensorMeta], idx: list[int]) -> tuple[list[int], int]:
    offs, pos = [], 0
    for i in idx:
        offs.append(pos)
        pos += _aligned(metas[i].nbytes)
    return offs, pos


def make_store(addr: str, port: int, world_size: int, rank: int, timeout_s: float = 600.0):
    """The group's rendezvous: rank 0 hosts it (port 0: any free port, read back from
    `store.port`, so there is no race for a port), the others connect to it. The host listens
    on `addr` only (the node's own address), not on every interface as TCPStore does when it
    opens the socket itself: its socket is bound here and handed over."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank != 0:
        return dist.TCPStore(addr, port, world_size, is_master=False, timeout=timeout)

    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((addr, port))
    sock.listen()
    port = sock.getsockname()[1]
    return dist.TCPStore(addr, port, world_size, is_master=True, timeout=timeout,
                         wait_for_workers=False, master_listen_fd=sock.detach())


def open_group(store, rank: int, world_size: int, backend: str, timeout_s: float = 600.0):
    """A standalone process group on `store`; every member calls it at about the same time
    and it returns once all have connected. `timeout_s` bounds each bucket (`finish`): gloo
    fails an operation after it by itself; NCCL's watchdog would end the process, so NCCL's
    own timeout is set WATCHDOG_MARGIN_S later and `finish` raises first."""
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size,
                                     datetime.timedelta(seconds=timeout_s))
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = datetime.timedelta(seconds=timeout_s + WATCHDOG_MARGIN_S)
        return dist.ProcessGroupNCCL(store, rank, world_size, opts)
    raise ValueError(f"weight sync backend {backend!r}: expected 'gloo' or 'nccl'")


def finish(work, timeout_s: float, what: str) -> None:
    """Wait for one collective of the sync, at most `timeout_s` seconds, on either backend.

    Why a timeout on the wait itself: under NCCL a plain `work.wait()` returns at once (it only
    orders the streams), so a member that never takes part leaves the kernel spinning until
    NCCL's watchdog ends the process (TORCH_NCCL_ASYNC_ERROR_HANDLING=3, torch's default).
    `wait(timeout)` polls the GPU, and past the timeout aborts the communicator and raises in
    this thread (torch's ProcessGroupNCCL WorkNCCL::wait); gloo raises "Operation timed out"
    the same way. Either error, and any other the collective ended with (gloo: a peer that
    died), is raised as SyncTimeout. Waiting for each bucket also holds the sender to one
    bucket in flight."""
    try:
        work.wait(datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:      # DistBackendError is one
        raise SyncTimeout(f"weight sync: {what} did not complete within {timeout_s:g} s "
                          "(actor.weight_sync_timeout_s), a member of the group stopped taking "
                          f"part: {str(exc).strip().splitlines()[-1]}") from None


def send(group, tensors: Iterable[torch.Tensor], metas: list[TensorMeta], bucket_bytes: int,
         device: torch.device, timeout_s: float = 600.0) -> int:
    """Rank 0: broadcast `tensors` (in `metas` order, cast to each meta's dtype) bucket by
    bucket, each finished within `timeout_s` (`finish`). `tensors` may be a generator that
    gathers each one just in time, so at most one bucket plus one tensor is held at once.
    Returns the bytes sent."""
    it = iter(tensors)
    sent = 0
    buckets = plan_buckets(metas, bucket_bytes)
    for k, idx in enumerate(buckets):
        offs, total = _offsets(metas, idx)
        flat = torch.empty(total, dtype=torch.uint8, device=device)
        for i, off in zip(idx, offs):
            m, t = metas[i], next(it)
            if tuple(t.shape) != m.shape:
                raise ValueError(f"weight sync: {m.name} has shape {tuple(t.shape)}, the plan "
                                 f"says {m.shape}")
            t = t.detach().to(device=device, dtype=getattr(torch, m.dtype)).contiguous()
            flat[off:off + m.nbytes].copy_(t.view(-1).view(torch.uint8))
        finish(group.broadcast(flat, 0), timeout_s, f"bucket {k + 1} of {len(buckets)}")
        sent += total
    return sent


def receive(group, metas: list[TensorMeta], bucket_bytes: int, device: torch.device,
            timeout_s: float = 600.0) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Other ranks: yield each bucket as (name, tensor) pairs, views into the received buffer
    on `device` (a loader that keeps a tensor must copy it; vLLM's loaders copy into their
    parameters), each bucket finished within `timeout_s` (`finish`)."""
    buckets = plan_buckets(metas, bucket_bytes)
    for k, idx in enumerate(buckets):
        offs, total = _offsets(metas, idx)
        flat = torch.empty(total, dtype=torch.uint8, device=device)
        finish(group.broadcast(flat, 0), timeout_s, f"bucket {k + 1} of {len(buckets)}")
        yield [(metas[i].name, flat[off:off + metas[i].nbytes]
                .view(getattr(torch, metas[i].dtype)).view(metas[i].shape))
               for i, off in zip(idx, offs)]
