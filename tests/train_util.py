"""`peer-rl train` in a fresh process, as a user runs it: start, kill a policy rank, read metrics."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil


def cmd(out, tiny, *extra):
    return [sys.executable, "-m", "peer_rl.cli", "train", f"trainer.output_dir={out}",
            f"model.path={tiny['policy']}", f"reward_model.path={tiny['judge']}", "ray.address=local",
            "trainer.save_freq=1", "logging.log_samples=true", "rollout.response_length=48",
            *extra]


def train(out, tiny, *extra, timeout=900):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd(out, tiny, *extra), capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def run_and_kill_an_actor(command, when, actor: str, timeout=900, env=None):
    """Start `command`; once the path `when` exists, SIGKILL the (last) process of the Ray
    actor class `actor` (e.g. "PolicyWorker"). Returns (returncode, stdout, stderr). `env`:
    more environment (PEER_RL_FAULTS: workers that die inside chosen calls)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    deadline = time.monotonic() + timeout
    killed = None
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if killed is None and when.is_dir():
                found = [p for p in psutil.Process(proc.pid).children(recursive=True)
                         if f"ray::{actor}" in " ".join(p.cmdline())]
                if found:
                    killed = found[-1].pid
                    os.kill(killed, signal.SIGKILL)
            time.sleep(0.3)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed is not None, f"the run ended before a {actor} process could be killed"
    return proc.returncode, stdout, stderr


def train_and_kill_a_policy_rank_after(out, tiny, step, *extra, timeout=900, env=None):
    """Start a run; once checkpoint step_<step> is complete, SIGKILL one policy rank process."""
    return run_and_kill_an_actor(cmd(out, tiny, *extra), out / "checkpoints" / f"step_{step}",
                                 "PolicyWorker", timeout, env)


def metrics(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def train_and_signal_after(out, tiny, steps, *extra, sig=signal.SIGTERM, timeout=900):
    """Start a run; once metrics.jsonl holds `steps` steps, send `sig` to the driver process
    alone (as a scheduler does). Returns (returncode, stdout, stderr)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd(out, tiny, *extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    deadline, sent = time.monotonic() + timeout, False
    try:
        while proc.poll() is None and time.monotonic() < deadline and not sent:
            path = out / "metrics.jsonl"
            if path.exists() and len(path.read_text().splitlines()) >= steps:
                proc.send_signal(sig)
                sent = True
            time.sleep(0.2)
        stdout, stderr = proc.communicate(timeout=max(60, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert sent, f"the run ended before step {steps} was logged:\n{stderr[-3000:]}"
    return proc.returncode, stdout, stderr


def _is_ray(p: psutil.Process) -> bool:
    """A process of the Ray cluster: GCS, raylet, dashboard, workers (their code under ray/)."""
    try:
        return p.name() in ("gcs_server", "raylet") or any(
            "ray::" in a or "/ray/" in a for a in p.cmdline())
    except psutil.NoSuchProcess:
        return False


def train_and_kill_the_cluster_after(out, tiny, step, *extra, timeout=900, env=None):
    """Start a run on a local cluster of its own; once checkpoint step_<step> is complete,
    SIGKILL every Ray process of that cluster (GCS, raylet, dashboard, workers, among the
    driver's descendants), leaving the driver and its own helpers, as when the cluster's nodes
    are lost under a driver that runs elsewhere. Returns (returncode,
    stdout, stderr, seconds from the kill to the exit). `env`: more environment."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(cmd(out, tiny, *extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    deadline, killed_at = time.monotonic() + timeout, None
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if killed_at is None and (out / "checkpoints" / f"step_{step}").is_dir():
                ray = [p for p in psutil.Process(proc.pid).children(recursive=True)
                       if _is_ray(p)]          # not the driver's own (W&B's service)
                assert any("gcs_server" in p.name() for p in ray), [p.name() for p in ray]
                for p in ray:
                    try:
                        p.kill()
                    except psutil.NoSuchProcess:
                        pass
                killed_at = time.monotonic()
            time.sleep(0.3)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed_at is not None, f"the run ended before step {step}:\n{stderr[-3000:]}"
    return proc.returncode, stdout, stderr, time.monotonic() - killed_at
