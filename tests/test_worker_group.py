"""WorkerGroup on real Ray actors: a stateless worker restarted while idle is counted."""
import os
import time

import pytest

pytestmark = pytest.mark.e2e


def _echo_class():
    """Defined in a function so Ray ships it by value (the test module is not importable on
    the workers)."""
    class Echo:
        def ask(self, chunk):
            import os
            return {"pid": os.getpid(), "items": list(chunk)}

        def health(self):
            return {"ok": True}
    return Echo


@pytest.fixture(scope="module")
def ray_session():
    import ray

    if ray.is_initialized():
        yield ray
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_a_restart_between_calls_is_counted_once_and_the_answer_stands(ray_session):
    from peer_rl.worker_group import WorkerGroup

    ray = ray_session
    handle = ray.remote(max_restarts=2, num_cpus=0)(_echo_class()).remote()
    group = WorkerGroup("echo", [handle], max_restarts=2, recovery_timeout_s=60,
                        identity=lambda r: r["pid"])
    first = group.map("ask", [[1, 2]])
    assert first[0]["items"] == [1, 2] and group.restarts == 0
    assert group.map("ask", [[3]])[0]["pid"] == first[0]["pid"] and group.restarts == 0
    ray.kill(handle, no_restart=False)                  # dies while idle; Ray restarts it
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(handle.health.remote(), timeout=10)
            break
        except Exception:
            time.sleep(0.5)
    again = group.map("ask", [[4]])
    assert again[0]["items"] == [4] and again[0]["pid"] != first[0]["pid"]
    assert group.restarts == 1
    group.map("ask", [[5]])
    assert group.restarts == 1                          # the same new process: not again
