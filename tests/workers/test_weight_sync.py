"""The weight-sync group's pieces: bucket plans worked out by hand, and a real gloo broadcast
between two threads (mixed dtypes, a tensor larger than a bucket)."""
import threading

import pytest
import torch

from peer_rl.workers.weight_sync import TensorMeta, make_store, open_group, plan_buckets, receive, send


def test_bucket_plan_by_hand():
    # float32 tensors of 10, 20, 5 and 40 elements: 40, 80, 20 and 160 bytes, each taking a
    # multiple of 64 bytes in a bucket: 64, 128, 64, 192
    metas = [TensorMeta(f"t{i}", (n,), "float32") for i, n in enumerate((10, 20, 5, 40))]
    assert plan_buckets(metas, 256) == [[0, 1, 2], [3]]       # 64 + 128 + 64 = 256
    assert plan_buckets(metas, 200) == [[0, 1], [2], [3]]     # 192, then 64 + 192 > 200
    assert plan_buckets(metas, 10) == [[0], [1], [2], [3]]    # too small: one tensor each
    assert TensorMeta("b", (3, 4), "bfloat16").nbytes == 24


def test_broadcast_round_trip_exact():
    g = torch.Generator().manual_seed(0)
    state = {"a": torch.randn(7, 3, generator=g), "b": torch.randn(300, generator=g),
             "c": torch.randint(0, 9, (5,), generator=g), "d": torch.tensor(2.5)}
    metas = [TensorMeta("a", (7, 3), "bfloat16"), TensorMeta("b", (300,), "float32"),
             TensorMeta("c", (5,), "int64"), TensorMeta("d", (), "float32")]
    store = make_store("127.0.0.1", 0, 2, 0)
    got, sent = {}, {}

    def host():
        sent["bytes"] = send(open_group(store, 0, 2, "gloo"), state.values(), metas, 512,
                             torch.device("cpu"))

    t = threading.Thread(target=host)
    t.start()
    peer = make_store("127.0.0.1", int(store.port), 2, 1)
    buckets = list(receive(open_group(peer, 1, 2, "gloo"), metas, 512, torch.device("cpu")))
    t.join(timeout=60)
    for bucket in buckets:
        got.update({k: v.clone() for k, v in bucket})
    assert len(buckets) == 3                                  # 64 | 1216 (alone) | 64 + 64
    assert torch.equal(got["a"], state["a"].to(torch.bfloat16))   # sent in the engines' dtype
    assert torch.equal(got["b"], state["b"]) and torch.equal(got["c"], state["c"])
    assert got["d"].shape == () and float(got["d"]) == 2.5
    assert sent["bytes"] == 64 + 1216 + 128


def test_a_shape_that_disagrees_with_the_plan_is_refused():
    with pytest.raises(ValueError, match="weight sync: w has shape \\(3,\\), the plan says \\(4,\\)"):
        send(None, [torch.zeros(3)], [TensorMeta("w", (4,), "float32")], 1024, torch.device("cpu"))


def _listeners(port: int) -> list[str]:
    """Local addresses listening on `port`, from the kernel's socket tables."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, hexport = local.split(":")
                if state == "0A" and int(hexport, 16) == port:        # 0A: LISTEN
                    out.append(addr)
    return out


def test_the_rendezvous_listens_on_the_nodes_address_only():
    """Issue 24.14: TCPStore opening its own socket listens on every interface; the store
    made here listens on the address it is given (127.0.0.1 is 0100007F in the table)."""
    import datetime

    import torch.distributed as dist

    default = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False,
                            timeout=datetime.timedelta(seconds=10))
    assert _listeners(default.port) != ["0100007F"]          # the wildcard, as the issue says
    store = make_store("127.0.0.1", 0, 1, 0)
    assert _listeners(store.port) == ["0100007F"]
    client = make_store("127.0.0.1", int(store.port), 1, 1)
    client.set("k", "v")
    assert store.get("k") == b"v"


_LINGERING: list = []       # groups whose last operation ends by their own timeout


def test_a_member_that_stops_taking_part_ends_the_send_within_its_timeout():
    """Issue 56.6: a member joined the group, then never receives (a stopped or stuck engine).
    The sender's bucket ends within its timeout with SyncTimeout (the wait that NCCL takes
    too); before, it waited for the group's own 600 s (and under NCCL for the watchdog, which
    ends the process)."""
    import time

    from peer_rl.workers.weight_sync import SyncTimeout

    # larger than the sockets' buffers, so the sender really waits on the receiver
    metas = [TensorMeta("w", (16 << 20,), "float32")]
    store = make_store("127.0.0.1", 0, 2, 0)
    joined, held = threading.Event(), _LINGERING

    def idle_member():                    # joins, holds its group open, never broadcasts
        held.append(open_group(make_store("127.0.0.1", int(store.port), 2, 1), 1, 2, "gloo",
                               timeout_s=10))
        joined.set()

    threading.Thread(target=idle_member, daemon=True).start()
    # the group's own timeout (10 s) is longer than the bucket's (2 s): the bucket's must end it
    group = open_group(store, 0, 2, "gloo", timeout_s=10)
    held.append(group)                    # its pending send ends at 10 s, not in a destructor
    assert joined.wait(30)
    t0 = time.monotonic()
    with pytest.raises(SyncTimeout, match="weight sync: bucket 1 of 1 did not complete within "
                                          "2 s"):
        send(group, [torch.zeros(16 << 20)], metas, 1 << 30, torch.device("cpu"), timeout_s=2)
    assert 1.5 < time.monotonic() - t0 < 6


def test_an_adapter_is_received_on_the_engines_device():
    """Issue 56.2: the engine's receive buffer is allocated on the engine worker's device
    (vllm_engine.engine_device), which NCCL requires; it was always the CPU. On this machine
    (no CUDA driver) a worker whose device is cuda:0 fails at that allocation, which shows
    where the buffer went; a CPU worker receives the adapter whole."""
    from safetensors.torch import load_file

    from peer_rl.workers.vllm_engine import WeightSyncExtension

    metas = [TensorMeta("base_model.model.q.lora_A.weight", (2, 4), "float32")]
    state = [torch.arange(8, dtype=torch.float32).view(2, 4)]

    def receive_on(device, directory, timeout_s):
        store = make_store("127.0.0.1", 0, 2, 0)
        sender = threading.Thread(target=lambda: _send_quietly(store, state, metas, timeout_s),
                                  daemon=True)
        sender.start()
        engine = WeightSyncExtension()
        engine.device = torch.device(device)
        engine.join_weight_sync("127.0.0.1", int(store.port), 1, 2, "gloo",
                                [(m.name, list(m.shape), m.dtype) for m in metas], 1 << 20,
                                '{"r": 2}', timeout_s)
        try:
            return engine.receive_adapter(str(directory))
        finally:
            sender.join(timeout=30)

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        assert receive_on("cpu", Path(tmp) / "v1", 30) == 1
        got = load_file(str(Path(tmp) / "v1" / "adapter_model.safetensors"))
        assert torch.equal(got["base_model.model.q.lora_A.weight"], state[0])
        with pytest.raises(RuntimeError, match="NVIDIA driver|CUDA"):
            receive_on("cuda:0", Path(tmp) / "v2", 2)
        assert not (Path(tmp) / "v2").exists()


def _send_quietly(store, state, metas, timeout_s):
    """Rank 0 of a test group: sends, and lets a receiver that failed end the send."""
    from peer_rl.workers.weight_sync import SyncTimeout

    try:
        send(open_group(store, 0, 2, "gloo", timeout_s=timeout_s), state, metas, 1 << 20,
             torch.device("cpu"), timeout_s=timeout_s)
    except SyncTimeout:
        pass
