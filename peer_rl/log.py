"""peer-rl's progress lines: the `peer_rl` logger and its one console handler.

A module says what it is doing with `log = logging.getLogger(__name__)` and `log.info(...)`
(`log.warning(...)` for what needs attention); the handler set up here, once per process by
peer_rl/__init__.py (so Ray workers print theirs too), shows each line as `[peer-rl] message`,
below WARNING on stdout and from WARNING up on stderr, flushed per line. It looks the stream up
at each line, so a redirected or captured sys.stdout/sys.stderr (pytest's capsys) sees it.
PEER_RL_LOG_LEVEL (default INFO) sets the level: WARNING keeps only the warnings.

What a command prints as its output (reports, tables, `[step N]` lines, benchmark results, chat
turns: anything without the `[peer-rl] ` prefix) stays `print`: it is the command's answer, not
a progress note, and no log level may hide it.
"""
from __future__ import annotations

import logging
import os
import sys

PREFIX = "[peer-rl] "
LEVEL_ENV = "PEER_RL_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class ConsoleHandler(logging.Handler):
    """`[peer-rl] message` on the current sys.stdout (below WARNING) or sys.stderr."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter(PREFIX + "%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:   # noqa: BLE001 - logging's own rule: a failed line never raises
            self.handleError(record)


def configure_console() -> logging.Logger:
    """The `peer_rl` logger with one ConsoleHandler (a second call adds none)."""
    logger = logging.getLogger("peer_rl")
    logger.propagate = False      # a host's root handlers (Ray, verl) would print each line twice
    if not any(isinstance(h, ConsoleHandler) for h in logger.handlers):
        logger.addHandler(ConsoleHandler())
    setting = os.environ.get(LEVEL_ENV, "INFO").strip().upper()
    if setting in LEVELS:
        logger.setLevel(setting)
    else:   # at import, in every process: a typo must not stop peer-rl, only be named once
        logger.setLevel(logging.INFO)
        logger.warning(f"{LEVEL_ENV}={os.environ[LEVEL_ENV]!r}: expected one of "
                       f"{', '.join(LEVELS)}; using INFO")
    return logger
