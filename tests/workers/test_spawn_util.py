"""spawn_util.start_ranks: the ranks are processes of their own, forked from a forkserver that
has the heavy modules imported already, and they run in the caller's environment."""
from __future__ import annotations

import json
import os
import sys

import pytest

import spawn_util

pytestmark = pytest.mark.e2e   # forks rank processes


def _report(rank: int, out: str) -> None:
    """What a rank finds on arrival. This module imports none of the worker's modules, so any
    of them already loaded came from the forkserver."""
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "ppid": os.getppid(),
                   "spawn_util_imported_by": spawn_util.IMPORTED_BY,
                   "missing": [m for m in spawn_util.PRELOAD if m not in sys.modules],
                   "probe": os.environ.get("PEER_RL_SPAWN_PROBE"),
                   "cwd": os.getcwd()}, f)


def test_ranks_are_forks_of_the_warm_forkserver_in_the_callers_environment(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("PEER_RL_SPAWN_PROBE", str(tmp_path))   # set after the server started
    monkeypatch.chdir(tmp_path)
    spawn_util.start_ranks(_report, (str(tmp_path),), 2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    pids = {r["pid"] for r in ranks}
    assert len(pids) == 2 and os.getpid() not in pids               # two processes of their own
    for r in ranks:
        # forked from the forkserver (its parent), which imported spawn_util and the rest
        assert r["spawn_util_imported_by"] == r["ppid"] != r["pid"], r
        assert r["missing"] == [], r
        assert r["probe"] == str(tmp_path) and r["cwd"] == str(tmp_path), r
