"""PEER_RL_FAULTS: which calls die, counted over processes, and a real SIGKILL of the caller."""
import signal
import subprocess
import sys

import pytest

from peer_rl.trainer.faults import Fault, parse, with_faults


def test_specs_parse_to_the_calls_that_die():
    a, b = parse(" UnifiRewardWorker.score@2, RedundancyWorker.similarities@3x9 ,")
    assert a == Fault("UnifiRewardWorker", "score", 2, 1)
    assert b == Fault("RedundancyWorker", "similarities", 3, 9)
    assert [n for n in range(1, 6) if a.dies(n)] == [2]
    assert [n for n in range(1, 15) if b.dies(n)] == list(range(3, 12))
    assert parse("") == []


@pytest.mark.parametrize("bad", ["Worker.score", "Worker@2", "Worker.score@two", "Worker.score@0",
                                 "Worker.score@2x0", "a.b.c@1", "Worker.score@1@2"])
def test_a_malformed_spec_is_named(bad):
    with pytest.raises(ValueError, match="PEER_RL_FAULTS: .*" + bad.split("@")[0].split(".")[0]):
        parse(bad)


class Echo:
    def ask(self, x):
        return x


def test_unarmed_classes_are_untouched(monkeypatch):
    monkeypatch.delenv("PEER_RL_FAULTS", raising=False)
    assert with_faults(Echo) is Echo
    monkeypatch.setenv("PEER_RL_FAULTS", "Other.ask@1")
    assert with_faults(Echo) is Echo


def test_a_missing_method_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("PEER_RL_FAULTS", "Echo.answer@1")
    monkeypatch.setenv("PEER_RL_FAULTS_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="Echo has no method 'answer'"):
        with_faults(Echo)


CHILD = """
import sys
from peer_rl.trainer.faults import with_faults
class Echo:
    def ask(self, x):
        return x
armed = with_faults(Echo)
assert armed.__name__ == "Echo" and issubclass(armed, Echo)
e = armed()
for i in range(int(sys.argv[1])):
    print("answered", e.ask(i), flush=True)
"""


def _child(n: int, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, str(n)], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.e2e   # child processes
def test_the_process_is_killed_inside_the_chosen_calls_counted_over_processes(tmp_path):
    import os

    env = {**os.environ, "PEER_RL_FAULTS": "Echo.ask@2x2", "PEER_RL_FAULTS_DIR": str(tmp_path)}
    first = _child(5, env)                   # call 1 answers, call 2 kills the process
    assert first.returncode == -signal.SIGKILL
    assert first.stdout.split("\n")[:-1] == ["answered 0"]
    assert "Echo.ask dies on call 2 and the next 1" in first.stderr
    second = _child(5, env)                  # a restart: its first call is call 3, which dies
    assert second.returncode == -signal.SIGKILL and second.stdout == ""
    third = _child(2, env)                   # calls 4 and 5: past the deaths, both answer
    assert third.returncode == 0, third.stderr
    assert third.stdout.split("\n")[:-1] == ["answered 0", "answered 1"]
    assert (tmp_path / "Echo.ask.calls").read_text() == "5"
