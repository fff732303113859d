"""A training run's output directory: a resume=auto with nothing to resume from does not wipe
the run there, a second run on the same directory is refused naming the first's pid, and a stop
signal checkpoints before any in-training evaluation. What follows the checks (prompt loading,
then Ray and the pools) is replaced by `Reached`: no cluster starts."""
import json
from types import SimpleNamespace

import pytest

from dir_holder import hold_dir
from peer_rl.cli import main


class Reached(Exception):
    pass


def _holder(out, command):
    return hold_dir(out, command)


def reached(*a, **k):
    raise Reached


@pytest.fixture()
def no_work(monkeypatch):
    monkeypatch.setattr("peer_rl.trainer.run.load_prompts", reached)       # train
    monkeypatch.setattr("peer_rl.trainer.supervised_run.plan_stage", reached)  # sft, train-rm


def _finished_run(out):
    """A run that finished with no checkpoint kept: its metrics and final policy."""
    (out / "final").mkdir(parents=True)
    (out / "final" / "config.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (out / ".peer-rl-out.json").write_text('{"command": "train"}')
    return {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_resume_auto_without_a_checkpoint_leaves_the_run_there(tmp_path, no_work, capsys):
    out = tmp_path / "run"
    before = _finished_run(out)
    assert main(["train", f"trainer.output_dir={out}", "resume=auto"]) == 2
    err = capsys.readouterr().err
    assert "no complete checkpoint to continue from" in err and str(out) in err
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # with a complete checkpoint the same command goes on to resume it
    ckpt = out / "checkpoints" / "step_2"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 2}))
    with pytest.raises(Reached):
        main(["train", f"trainer.output_dir={out}", "resume=auto"])


@pytest.mark.parametrize("command", ["train", "sft"])
def test_a_second_run_on_one_output_directory_is_refused_naming_the_first(
        command, tmp_path, no_work, capsys):
    out = tmp_path / "run"
    holder = _holder(out, command)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main([command, f"trainer.output_dir={out}", "resume=auto"]) == 2
        err = capsys.readouterr().err
        assert f"in use by another process (pid {holder.pid})" in err and str(out) in err
    finally:
        holder.kill()
        holder.wait()
    for _ in range(2):    # the lock went with the first process; a run ended releases its own
        with pytest.raises(Reached):
            main([command, f"trainer.output_dir={out}", "resume=auto"])


def test_a_stop_signal_checkpoints_without_the_in_training_evaluation(tmp_path):
    """SIGTERM during step 2 of 4 with an evaluation due at every step: step 1 is evaluated,
    step 2 is checkpointed without one (a slow judge could outlast the grace period)."""
    from peer_rl.tracking.metrics import MetricsSink
    from peer_rl.trainer.controller import Controller
    from peer_rl.trainer.preemption import StopRequest

    calls = []
    stop = StopRequest()
    c = Controller.__new__(Controller)
    c.cfg = SimpleNamespace(trainer=SimpleNamespace(total_steps=4, save_freq=0, eval_freq=1))
    c.out, c.step, c.staleness, c.evaluator = tmp_path, 0, 0, object()

    def train_step(rows, ready, look_ahead):
        calls.append(f"step {c.step + 1}")
        if c.step + 1 == 2:
            stop.signal = "SIGTERM"             # what the handler records
        return {"reward/mean": 0.0}, None

    c.train_step = train_step
    c.evaluate = lambda: calls.append(f"eval {c.step}") or {}
    c.save_checkpoint = lambda: calls.append(f"checkpoint {c.step}") or tmp_path
    c.metrics = MetricsSink(tmp_path, loggers=[])        # a sink that records nothing
    c.write_memory = lambda: None
    c.plot_later = lambda: calls.append(f"figures {c.step}")
    assert c.fit(stop, plot=False) == 2
    # the figures follow the checkpoint: a run that stops has those of its last one
    assert calls == ["step 1", "eval 1", "step 2", "checkpoint 2", "figures 2"]
    assert c.stopped_by == "SIGTERM"
