"""peer_rl.cli.leave: the program ends with its exit handlers run and its output flushed,
without the interpreter's teardown; in-process callers of main() keep their process."""
import subprocess
import sys
import textwrap

import pytest


@pytest.mark.e2e   # a child process
def test_leave_runs_the_exit_handlers_flushes_and_skips_the_teardown(tmp_path):
    marker = tmp_path / "handler-ran"
    child = textwrap.dedent(f"""
        import atexit, sys
        from peer_rl.cli import leave

        class Teardown:                      # freed only by the interpreter's teardown
            def __del__(self):
                sys.stdout.write("teardown ran")
                sys.stdout.flush()

        kept = Teardown()
        atexit.register(lambda: open({str(marker)!r}, "w").write("yes"))
        sys.stdout.write("buffered, no newline")
        sys.stderr.write("to stderr")
        leave(3)
        print("not reached")
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
    assert out.returncode == 3
    assert out.stdout == "buffered, no newline"
    assert out.stderr == "to stderr"
    assert marker.read_text() == "yes"


def test_main_called_in_process_returns_its_code():
    """Only the program (argv from sys.argv) leaves early: a caller passing argv gets the code."""
    from peer_rl.cli import main

    assert main(["train", "recipe=no_such_recipe"]) == 2
