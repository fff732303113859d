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


LOG_FILE_REFRESH_S = 30.0     # a progress bar's line in a log file: at most this often


class _Lines:
    """A stream a progress bar writes to where the console is a file, not a terminal: each of
    the bar's redraws (`\\r` + status + padding) becomes a line of its own, so the bar never
    shares a line with the `[step N]` lines or another process's output (`ray job logs`)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").rstrip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(**kwargs):
    """tqdm on the current sys.stderr: redrawn in place on a terminal; in a log file a line per
    redraw, at most every LOG_FILE_REFRESH_S seconds (and the last state when it closes)."""
    from tqdm import tqdm  # deferred: every process imports this module; few draw a bar

    stream = sys.stderr
    if stream.isatty():
        return tqdm(file=stream, dynamic_ncols=True, **kwargs)
    return tqdm(file=_Lines(stream), **{"mininterval": LOG_FILE_REFRESH_S, "ncols": 100,
                                        **kwargs})
