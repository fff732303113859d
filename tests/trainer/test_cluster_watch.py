"""The cluster watch on real sockets: a listening port is the GCS, closing it loses the
cluster; the exit is captured instead of ending the test process."""
import socket
import threading
import time
from pathlib import Path

import pytest

from peer_rl.trainer.cluster_watch import (ClusterWatch, effective_lost_after, lost_message,
                                           reachable)


@pytest.fixture
def gcs():
    """A listening TCP socket on the loopback: (address, close)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    return f"127.0.0.1:{srv.getsockname()[1]}", srv.close


def _watch(address, **kw):
    exits = []
    w = ClusterWatch(address, kw.pop("lost_after_s", 0.5), step=lambda: 4,
                     last_checkpoint=lambda: Path("/runs/a/checkpoints/step_3"), interval_s=0.1,
                     exit=exits.append, **kw)
    return w, exits


def test_held_below_rays_own_limit():
    assert effective_lost_after(30.0, {}) == 30.0                 # Ray's 60 s - 5 s = 55 s
    assert effective_lost_after(90.0, {}) == 55.0
    assert effective_lost_after(30.0, {"RAY_gcs_rpc_server_reconnect_timeout_s": "20"}) == 15.0
    assert effective_lost_after(4.0, {"RAY_gcs_rpc_server_reconnect_timeout_s": "20"}) == 4.0
    assert effective_lost_after(30.0, {"RAY_gcs_rpc_server_reconnect_timeout_s": "x"}) == 30.0


def test_reachable_only_while_the_port_listens(gcs):
    address, close = gcs
    assert reachable(address, 1.0)
    close()
    assert not reachable(address, 1.0)
    assert not reachable("not-an-address", 1.0)


def test_an_answering_gcs_is_never_lost(gcs):
    address, close = gcs
    w, exits = _watch(address)
    w.start()
    time.sleep(1.0)                       # twice lost_after_s, answered every 0.1 s
    w.stop()
    close()
    assert exits == [] and w.lost is None


def test_a_silent_gcs_ends_the_run_with_exit_3_after_lost_after_s(gcs, capsys):
    address, close = gcs
    closed = []
    w, exits = _watch(address)
    w.on_lost.append(lambda: closed.append("trackers"))
    w.start()
    time.sleep(0.3)
    assert exits == []
    close()
    t0 = time.monotonic()
    while not exits and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    waited = time.monotonic() - t0
    assert exits == [3] and closed == ["trackers"]
    # silent from the last probe that answered (at most one interval, 0.1 s, before the close)
    assert 0.4 <= waited < 2.0, waited
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the Ray cluster is gone: its GCS "
                                                   f"at {address} did not answer for ")
    assert "during step 4; nothing of step 4 is kept. Last complete checkpoint: " \
           "/runs/a/checkpoints/step_3. Start the cluster again and rerun the same command " \
           "with resume=auto to continue from it." in err


def test_a_hanging_close_does_not_hold_the_exit(gcs):
    address, close = gcs
    w, exits = _watch(address, grace_s=0.2)
    w.on_lost.append(threading.Event().wait)          # never returns
    w.on_lost.append(lambda: 1 / 0)                   # raises: said, then the exit
    close()
    w.start()
    t0 = time.monotonic()
    while not exits and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert exits == [3] and time.monotonic() - t0 < 2.0


def test_the_line_before_the_first_step_and_without_a_checkpoint():
    assert lost_message("10.0.0.1:6379", 0, 0, None) == (
        "the Ray cluster is gone: its GCS at 10.0.0.1:6379 did not answer before the first "
        "step. Last complete checkpoint: none. Start the cluster again and rerun the same "
        "command with resume=auto to continue from it.")
