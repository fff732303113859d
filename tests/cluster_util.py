"""The two-node Ray cluster of cluster/start-local-cluster.sh, started and stopped as its header
says, for the tests that need a real multi-node cluster (tests/test_cluster.py, the planner's
probe)."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"
VENV_BIN = Path(sys.executable).parent
RAY = VENV_BIN / "ray"


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


class LocalCluster:
    """The two-node cluster of cluster/start-local-cluster.sh, driven as its header says."""

    def __init__(self, cluster_dir: Path, env: dict[str, str]):
        self.dir, self.env = cluster_dir, env
        self.dashboard = f"http://127.0.0.1:{env['DASHBOARD_PORT']}"

    def script(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(CLUSTER / "start-local-cluster.sh"), command],
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def cli(self, *args: str, timeout: float = 60,
            check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(RAY), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=REPO)
        if check and proc.returncode:
            raise AssertionError(f"ray {' '.join(args)} -> {proc.returncode}\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def nodes(self) -> list[dict]:
        out = self.cli("list", "nodes", "--address", self.dashboard, "--format", "json",
                       "--detail", check=False)
        if out.returncode:
            return []
        try:
            return json.loads(out.stdout)
        except json.JSONDecodeError:
            return []

    def jobs(self) -> list[dict]:
        out = self.cli("list", "jobs", "--address", self.dashboard, "--format", "json",
                       "--detail").stdout
        # an empty list is printed as this sentence, not as JSON
        return [] if out.strip() == "No resource in the cluster" else json.loads(out)

    def leftovers(self) -> list[psutil.Process]:
        """Live processes naming the cluster's directory (raylets, GCS, agents, workers)."""
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.pid != os.getpid() and str(self.dir) in " ".join(p.info["cmdline"] or ()):
                    if p.status() != psutil.STATUS_ZOMBIE:
                        found.append(p)
            except (psutil.Error, OSError):
                continue
        return found


@contextlib.contextmanager
def started_cluster(**settings: str):
    """cluster/start-local-cluster.sh start ... stop, exactly as a user runs it: free ports, a
    short directory of its own (Unix socket paths must stay under 108 bytes) and a token of its
    own (the test neither needs nor touches ~/.ray/auth_token). `settings`: more of the script's
    environment (HEAD_GPUS=4, WORKER_CPUS=8, ...)."""
    cluster_dir = Path(tempfile.mkdtemp(prefix="prl-ray-", dir="/tmp"))
    token = cluster_dir / "auth_token"
    token.write_text(secrets.token_hex(32))
    gcs, dashboard = _free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PEER_RL_"))}
    env |= {"PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",  # the job's `python`
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "PYTHONUNBUFFERED": "1",
            "PEER_RL_CLUSTER_DIR": str(cluster_dir), "RAY_PORT": str(gcs),
            "DASHBOARD_PORT": str(dashboard), "OBJECT_STORE_BYTES": "200000000", **settings}
    cluster = LocalCluster(cluster_dir, env)
    try:
        started = cluster.script("start")
        logs = "".join(f"\n--- {n}.log\n{_tail(cluster_dir / (n + '.log'))}"
                       for n in ("head", "worker"))
        assert started.returncode == 0, started.stdout + started.stderr + logs
        assert f"dashboard / job server: {cluster.dashboard}" in started.stdout
        yield cluster
    finally:
        stopped = cluster.script("stop", timeout=120)
        left = cluster.leftovers()
        _, left = psutil.wait_procs(left, timeout=5)
        report = []
        for p in left:
            try:
                report.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=10)
        status = cluster.script("status").stdout
        shutil.rmtree(cluster_dir, ignore_errors=True)
    assert stopped.returncode == 0 and "stopped the local cluster" in stopped.stdout, (
        stopped.stdout + stopped.stderr)
    assert status == "head: stopped\nworker: stopped\n", status
    assert not report, f"processes left after `start-local-cluster.sh stop`: {report}"
