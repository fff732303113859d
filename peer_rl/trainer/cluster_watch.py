"""Losing the Ray cluster ends the run with exit 3, the last complete checkpoint and the way on.

When the cluster's GCS goes away (the head node lost, a local cluster's processes killed),
calls in flight fail, a worker group starts waiting for restarts that can never come, and Ray's
own core worker ends the driver with exit 1 once it has failed to reach the GCS for
`gcs_rpc_server_reconnect_timeout_s` (60 s by default) and a message that says nothing about
the run. The watch is a daemon thread of the driver that opens a TCP connection to the GCS's
port every few seconds; once none has succeeded for `ray.lost_after_s`, kept below Ray's own
limit, it closes the trackers, prints one line and ends the process with exit 3. A TCP
connection, not a Ray call: every Ray call needs the GCS the watch is asking about, and would
wait on Ray's own reconnect loop.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

EXIT_CODE = 3                  # a pool or endpoint that cannot go on (peer_rl.cli.errors)
RAY_RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
RAY_RECONNECT_DEFAULT_S = 60.0
MARGIN_S = 5.0                 # the watch ends the run this long before Ray's core would


class ClusterLost(RuntimeError):
    """The Ray cluster went away under the run (exit 3, like a pool that cannot go on)."""


def effective_lost_after(setting: float, env: dict | None = None) -> float:
    """`ray.lost_after_s`, held below the limit after which Ray's core worker ends the driver
    itself (its RAY_gcs_rpc_server_reconnect_timeout_s, 60 s by default), less a margin: past
    that limit Ray's exit 1 would come first."""
    env = os.environ if env is None else env
    try:
        ray_limit = float(env.get(RAY_RECONNECT_ENV, RAY_RECONNECT_DEFAULT_S))
    except ValueError:
        ray_limit = RAY_RECONNECT_DEFAULT_S
    return max(1.0, min(setting, ray_limit - MARGIN_S))


def reachable(address: str, timeout: float) -> bool:
    """True when a TCP connection to `host:port` opens within `timeout` seconds."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def lost_message(address: str, seconds: float, step: int, checkpoint: Path | None) -> str:
    """The one line a run lost with its cluster ends with (`seconds` 0: found by a call that
    failed, not by the watch's probes)."""
    silent = f" for {seconds:.0f} s (ray.lost_after_s)" if seconds else ""
    when = f"during step {step}; nothing of step {step} is kept" if step else \
        "before the first step"
    return (f"the Ray cluster is gone: its GCS at {address} did not answer{silent} {when}. "
            f"Last complete checkpoint: {checkpoint if checkpoint else 'none'}. Start the "
            "cluster again and rerun the same command with resume=auto to continue from it.")


class ClusterWatch:
    """Probe `address` every `interval_s`; after `lost_after_s` without an answer, run
    `on_lost` (bounded: each callback gets `grace_s` seconds in all), print the line and
    `exit(3)`. `step` and `last_checkpoint` say where the run stood. `exit` is os._exit: the
    main thread is blocked in a Ray call that will not return, and the interpreter's teardown
    would wait on Ray's."""

    def __init__(self, address: str, lost_after_s: float, step: Callable[[], int],
                 last_checkpoint: Callable[[], Path | None], interval_s: float = 2.0,
                 grace_s: float = 10.0, exit: Callable[[int], None] = os._exit):
        self.address, self.lost_after_s = address, lost_after_s
        self.step, self.last_checkpoint = step, last_checkpoint
        self.interval_s, self.grace_s, self.exit = interval_s, grace_s, exit
        self.on_lost: list[Callable[[], object]] = []
        self.lost: str | None = None          # the line, once the cluster is lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="peer-rl-cluster-watch",
                                        daemon=True)

    def start(self) -> "ClusterWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        """The run is over (or shutting Ray down itself): no more probes."""
        self._stop.set()

    def _watch(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.wait(self.interval_s):
            if reachable(self.address, timeout=self.interval_s):
                last_ok = time.monotonic()
                continue
            silent = time.monotonic() - last_ok
            if silent >= self.lost_after_s and not self._stop.is_set():
                self._end(silent)
                return

    def _end(self, silent: float) -> None:
        self.lost = lost_message(self.address, silent, self.step(), self.last_checkpoint())
        for fn in self.on_lost:            # e.g. the trackers' close: bounded, never fatal
            done = threading.Thread(target=_quietly, args=(fn,), daemon=True)
            done.start()
            done.join(self.grace_s)
        print(f"error: {self.lost}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        self.exit(EXIT_CODE)


def _quietly(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the run is ending; say it and go on
        log.warning(f"while ending the run after losing the cluster: {exc}")
