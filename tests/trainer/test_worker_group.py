"""WorkerGroup on real Ray actors: a stateless worker restarted while idle is counted."""
import time

import pytest

from peer_rl.trainer.worker_group import GroupHooks

pytestmark = pytest.mark.e2e


class Hooks(GroupHooks):
    """The group's questions answered as a test sets them (the defaults: GroupHooks')."""

    def __init__(self, step: int = 0, checkpoint=None, by_pid: bool = False):
        self._step, self._checkpoint, self.by_pid = step, checkpoint, by_pid

    def step(self) -> int:
        return self._step

    def last_checkpoint(self):
        return self._checkpoint

    def identity(self, result):
        return result["pid"] if self.by_pid else None


def _echo_class():
    """Defined in a function so Ray ships it by value (the test module is not importable on
    the workers)."""
    class Echo:
        def ask(self, chunk):
            import os
            return {"pid": os.getpid(), "items": list(chunk)}

        def health(self):
            import os
            return {"ok": True, "pid": os.getpid()}
    return Echo


def test_a_restart_between_calls_is_counted_once_and_the_answer_stands(ray_session):
    from peer_rl.trainer.worker_group import WorkerGroup

    ray = ray_session
    handle = ray.remote(max_restarts=2, num_cpus=0)(_echo_class()).remote()
    group = WorkerGroup("echo", [handle], max_restarts=2, recovery_timeout_s=60,
                        hooks=Hooks(by_pid=True))
    first = group.map("ask", [[1, 2]])
    assert first[0]["items"] == [1, 2] and group.restarts == 0
    assert group.map("ask", [[3]])[0]["pid"] == first[0]["pid"] and group.restarts == 0
    ray.kill(handle, no_restart=False)                  # dies while idle; Ray restarts it
    # ray.kill returns before the process is gone: wait for an answer from a new process (an
    # answer from the old one, still alive for a moment, is not the restart)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if ray.get(handle.health.remote(), timeout=10)["pid"] != first[0]["pid"]:
                break
        except Exception:
            pass
        time.sleep(0.5)
    again = group.map("ask", [[4]])
    assert again[0]["items"] == [4] and again[0]["pid"] != first[0]["pid"]
    assert group.restarts == 1
    group.map("ask", [[5]])
    assert group.restarts == 1                          # the same new process: not again


def _armed_echo(monkeypatch, tmp_path, spec: str):
    """The Echo class armed by PEER_RL_FAULTS: its process SIGKILLs itself inside `ask`."""
    from peer_rl.trainer.faults import with_faults

    monkeypatch.setenv("PEER_RL_FAULTS", spec)
    monkeypatch.setenv("PEER_RL_FAULTS_DIR", str(tmp_path))
    return with_faults(_echo_class())


def test_a_worker_killed_mid_call_is_restarted_and_only_its_chunk_redone(ray_session, capsys,
                                                                          monkeypatch, tmp_path):
    from peer_rl.trainer.worker_group import WorkerGroup

    ray = ray_session
    armed = _armed_echo(monkeypatch, tmp_path, "Echo.ask@2")  # worker 0 dies in its 2nd call
    handles = [ray.remote(max_restarts=2, num_cpus=0)(cls).remote()
               for cls in (armed, _echo_class())]
    group = WorkerGroup("echo", handles, max_restarts=2, recovery_timeout_s=60,
                        hooks=Hooks(step=7))
    first = group.map("ask", [[1], [2]])
    assert [r["items"] for r in first] == [[1], [2]] and group.restarts == 0
    again = group.map("ask", [[3, 4], [5, 6]])
    assert [r["items"] for r in again] == [[3, 4], [5, 6]]
    assert group.restarts == 1
    assert again[0]["pid"] != first[0]["pid"] and again[1]["pid"] == first[1]["pid"]
    assert "echo worker 0 died during step 7" in capsys.readouterr().err


def test_a_worker_that_dies_past_max_actor_restarts_ends_the_step_with_the_way_on(
        ray_session, monkeypatch, tmp_path):
    from peer_rl.trainer.worker_group import PoolFailed, WorkerGroup

    ray = ray_session
    cls = _armed_echo(monkeypatch, tmp_path, "Echo.ask@2x9")
    handle = ray.remote(max_restarts=1, num_cpus=0)(cls).remote()
    group = WorkerGroup("echo", [handle], max_restarts=1, recovery_timeout_s=60,
                        hooks=Hooks(step=4, checkpoint=tmp_path / "step_3"))
    assert group.map("ask", [[1]])[0]["items"] == [1]
    with pytest.raises(PoolFailed) as info:
        group.map("ask", [[2]])                                 # dies, restarted, dies again
    msg = str(info.value)
    assert msg.startswith("echo worker 0 failed 2 time(s) in step 4 "
                          "(trainer.max_actor_restarts=1); giving up")
    assert f"Last complete checkpoint: {tmp_path / 'step_3'}" in msg and "resume=auto" in msg
    assert group.restarts == 1
    assert (tmp_path / "Echo.ask.calls").read_text() == "3"    # 1 answered, 2 and 3 died


def _split_class():
    from peer_rl.protocol import Dispatch, dispatch

    class Split:
        @dispatch(Dispatch.SHARD)
        def each(self, items, tag):
            import os
            return [(os.getpid(), tag, x) for x in items]

        @dispatch(Dispatch.ONE)
        def together(self, items, tag):
            import os
            return {"pid": os.getpid(), "tag": tag, "items": list(items)}

        def undeclared(self, items):
            return items

        def health(self):
            import os
            return {"ok": True, "pid": os.getpid()}
    return Split


def test_a_call_is_split_and_gathered_as_the_worker_method_declares(ray_session):
    from peer_rl.trainer.worker_group import WorkerGroup

    ray = ray_session
    cls = _split_class()
    handles = [ray.remote(cls).options(num_cpus=0).remote() for _ in range(2)]
    pids = [ray.get(h.health.remote())["pid"] for h in handles]
    group = WorkerGroup("split", handles, max_restarts=0, recovery_timeout_s=60, cls=cls)
    # SHARD: contiguous near-equal parts (3 then 2), the answers back in item order
    assert group.call("each", [1, 2, 3, 4, 5], "t") == [
        (pids[0], "t", 1), (pids[0], "t", 2), (pids[0], "t", 3), (pids[1], "t", 4),
        (pids[1], "t", 5)]
    # ONE: every item to the first worker, its answer as it is
    assert group.call("together", [1, 2, 3], "u") == {"pid": pids[0], "tag": "u",
                                                        "items": [1, 2, 3]}
    with pytest.raises(TypeError, match="Split.undeclared declares no dispatch mode"):
        group.call("undeclared", [1])
    for h in handles:
        ray.kill(h)
