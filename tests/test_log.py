"""peer-rl's progress lines (peer_rl/log.py): `[peer-rl] message`, info on stdout and warnings
on stderr, as the hand-written prints showed them, and in every process that imports peer_rl."""
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import peer_rl  # noqa: F401 - configures the console handler

ROOT = Path(__file__).resolve().parent.parent


def test_info_goes_to_stdout_and_warning_to_stderr(capsys):
    log = logging.getLogger("peer_rl.some.module")
    log.info("x")
    log.warning("careful: %d left", 2)
    out, err = capsys.readouterr()
    assert out == "[peer-rl] x\n"
    assert err == "[peer-rl] careful: 2 left\n"


def test_a_stream_swapped_after_set_up_receives_the_line(capsys, monkeypatch):
    """The stream is looked up per line, not kept from when the handler was made."""
    class Lines(list):
        def write(self, text):
            self.append(text)

        def flush(self):
            self.append("<flushed>")

    lines = Lines()
    monkeypatch.setattr(sys, "stdout", lines)
    logging.getLogger("peer_rl.x").info("y")
    assert lines == ["[peer-rl] y\n", "<flushed>"]


@pytest.mark.e2e   # a child interpreter
def test_a_fresh_process_shows_the_lines_and_honours_the_level():
    code = ("import logging, peer_rl\n"
            "log = logging.getLogger('peer_rl.a')\n"
            "log.info('i')\nlog.warning('w')\nprint('output')")
    run = lambda **env: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    default = run()
    assert (default.stdout, default.stderr) == ("[peer-rl] i\noutput\n", "[peer-rl] w\n")
    quiet = run(PEER_RL_LOG_LEVEL="warning")
    assert (quiet.stdout, quiet.stderr) == ("output\n", "[peer-rl] w\n")
    typo = run(PEER_RL_LOG_LEVEL="verbose")
    assert typo.returncode == 0 and typo.stdout == "[peer-rl] i\noutput\n"
    assert typo.stderr == ("[peer-rl] PEER_RL_LOG_LEVEL='verbose': expected one of DEBUG, INFO, "
                           "WARNING, ERROR; using INFO\n[peer-rl] w\n")


def test_in_a_log_file_the_bar_and_the_step_lines_never_share_a_line(capsys):
    """Captured stderr is not a terminal, as a `ray job logs` file is not: every redraw of the
    bar is a line of its own, the step lines printed between them stay whole."""
    from peer_rl.log import progress_bar

    bar = progress_bar(total=3, desc="grpo", unit="step", mininterval=0)
    for step in (1, 2, 3):
        print(f"[step {step}] mean=1.000", file=sys.stderr, flush=True)
        bar.update(1)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert "\r" not in "".join(lines)
    steps = [ln for ln in lines if "[step" in ln]
    assert steps == [f"[step {s}] mean=1.000" for s in (1, 2, 3)]      # nothing glued on
    bars = [ln for ln in lines if ln.startswith("grpo:")]
    assert bars[0].startswith("grpo:   0%") and "3/3" in bars[-1]
    assert len(steps) + len(bars) == len(lines)


def test_a_bar_in_a_log_file_redraws_at_most_every_30_s(capsys):
    from peer_rl.log import progress_bar

    bar = progress_bar(total=100, desc="eval", unit="case")
    for _ in range(100):
        bar.update(1)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "0/100" in lines[0] and "100/100" in lines[1]
