"""The weight-sync group's pieces: bucket plans worked out by hand, and a real gloo broadcast
between two threads (mixed dtypes, a tensor larger than a bucket)."""
import threading

import pytest
import torch

from workers.weight_sync import TensorMeta, make_store, open_group, plan_buckets, receive, send


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
