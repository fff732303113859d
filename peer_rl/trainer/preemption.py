"""A clean stop on a scheduler's signal: SIGTERM (Slurm, Kubernetes, `ray job stop`) or SIGINT
ends the run after the current step, with that step checkpointed, so `resume=auto` loses
nothing; a second signal stops at once (the default action), as a user pressing Ctrl-C twice
expects. The handler only records the signal: a blocking Ray call is never interrupted
mid-step, the step finishes, then the loop stops."""
from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXIT_CODE = 128 + signal.SIGTERM        # what a process killed by SIGTERM reports


class StopRequest:
    """`with StopRequest() as stop:` ... `if stop.signal: ...`; handlers restored on exit."""

    def __init__(self, what: str = "the current step"):
        self.what, self.signal, self._old = what, None, {}

    def __enter__(self) -> "StopRequest":
        return self.install()

    def install(self) -> "StopRequest":
        """(Re)take the signals: call again after ray.init, whose driver installs a C++
        handler that turns SIGTERM into an abort."""
        if threading.current_thread() is threading.main_thread():   # else Python refuses
            for sig in SIGNALS:
                old = signal.signal(sig, self._handle)
                self._old.setdefault(sig, old)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _handle(self, signum, frame) -> None:
        if self.signal is not None:            # the second one: stop now
            old = self._old.get(signum)
            self.__exit__()
            if callable(old):                  # Python's own (KeyboardInterrupt) or Ray's:
                old(signum, frame)             # raised here, not at a later bytecode check
            # reached when the replaced handler was SIG_DFL/SIG_IGN or returned: the signal
            # again, now to the restored handler (SIG_DFL: the system's default action)
            os.kill(os.getpid(), signum)
            return
        self.signal = signal.Signals(signum).name
        log.warning(f"{self.signal}: finishing {self.what}, then a checkpoint and a stop; "
                    "send it again to stop at once")


class RunStopped(RuntimeError):
    """The run stopped early on a signal, its last step checkpointed."""
