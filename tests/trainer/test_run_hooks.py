"""What the controller answers its worker groups (peer_rl.trainer.controller.RunHooks and its
rollout and retrieval kinds), on a stand-in controller: no Ray actor, no pool. The groups' use of
the answers on real actors: tests/trainer/test_worker_group.py."""
from types import SimpleNamespace

from peer_rl.trainer.controller import RetrievalHooks, RolloutHooks, RunHooks
from peer_rl.trainer.worker_group import GroupHooks


def _controller(tmp_path, restart=None):
    calls = []
    return SimpleNamespace(
        step=4, out=tmp_path, pools=SimpleNamespace(restart=restart), calls=calls,
        _resync_restarted=lambda i: calls.append(("resync", i)),
        _check_engine_weights=lambda i, method, result: calls.append(("check", i, method, result)))


def test_a_group_on_its_own_asks_nothing_of_a_run():
    hooks = GroupHooks()
    assert (hooks.step(), hooks.last_checkpoint(), hooks.replace("rollout", 0)) == (0, None, None)
    assert hooks.on_restart(0) is None and hooks.check(0, "generate", [1]) is None
    assert hooks.identity({"pid": 7}) is None


def test_every_group_of_a_run_names_the_step_in_progress_and_its_checkpoint(tmp_path):
    ctl = _controller(tmp_path)
    hooks = RunHooks(ctl)
    assert hooks.step() == 5                      # steps done: 4; the one in progress: 5
    assert hooks.last_checkpoint() is None        # none written yet
    assert hooks.replace("rollout", 1) is None    # no placement layer to replace it
    ctl.pools.restart = lambda pool, i: f"new {pool} {i}"
    assert hooks.replace("reward_model", 1) == "new reward_model 1"
    hooks.on_restart(0)
    hooks.check(0, "generate", ["s"])
    assert ctl.calls == [] and hooks.identity(SimpleNamespace(pids=[9])) is None


def test_the_rollout_group_resyncs_and_checks_and_retrieval_names_its_process(tmp_path):
    ctl = _controller(tmp_path)
    rollout = RolloutHooks(ctl)
    rollout.on_restart(2)
    rollout.check(1, "generate", ["s"])
    assert ctl.calls == [("resync", 2), ("check", 1, "generate", ["s"])]
    assert rollout.step() == 5
    assert RetrievalHooks(ctl).identity(SimpleNamespace(pids=[42, 43])) == 42
