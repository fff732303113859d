"""StopRequest: the first SIGTERM / SIGINT is recorded and the process goes on; the handlers are
restored afterwards; a second signal stops the process at once."""
import os
import signal
import subprocess
import sys

import pytest

from peer_rl.trainer.preemption import StopRequest


def test_the_first_signal_is_recorded_and_the_handlers_restored(capsys):
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest("step 7") as stop:
        assert stop.signal is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signal == "SIGTERM"              # recorded; we are still running
        stop.install()                               # taken again (after ray.init): kept
        assert stop.signal == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
    assert "SIGTERM: finishing step 7, then a checkpoint and a stop" in capsys.readouterr().err


# Python's own SIGINT handling, whatever the test runner inherited: a shell starts background
# jobs with SIGINT ignored, and a child would then ignore the second signal as its parent asked
CHILD = """
import os, signal, time
from peer_rl.trainer.preemption import StopRequest
signal.signal(signal.SIGINT, signal.default_int_handler)
with StopRequest() as stop:
    os.kill(os.getpid(), signal.SIGINT)
    print("after the first:", stop.signal, flush=True)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
    print("not reached", flush=True)
"""


@pytest.mark.e2e   # a child process
def test_a_second_signal_stops_at_once():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout == "after the first: SIGINT\n"
    # the default SIGINT action in Python: KeyboardInterrupt, exit code 1 with its traceback
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
