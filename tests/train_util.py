"""`peer-rl train` in a fresh process, as a user runs it: start, kill the whole cluster at a
checkpoint, signal the driver, read metrics."""
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


def run_and_act(command, when, act, timeout=900, env=None):
    """Start `command` in a session of its own; once the path `when` exists, `act(driver)` (a
    psutil.Process) until it returns something other than None. Returns (returncode, stdout,
    stderr, what `act` returned, seconds from then to the exit). `env`: more environment."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    deadline, acted, acted_at = time.monotonic() + timeout, None, None
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if acted is None and when.is_dir():
                acted = act(psutil.Process(proc.pid))
                acted_at = time.monotonic() if acted is not None else None
            time.sleep(0.3)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    waited = time.monotonic() - acted_at if acted_at is not None else None
    return proc.returncode, stdout, stderr, acted, waited


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
    are lost under a driver that runs elsewhere. Returns (returncode, stdout, stderr, seconds
    from the kill to the exit). `env`: more environment."""
    def kill(driver):
        ray = [p for p in driver.children(recursive=True) if _is_ray(p)]  # not W&B's service
        assert any("gcs_server" in p.name() for p in ray), [p.name() for p in ray]
        for p in ray:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        return len(ray)

    code, stdout, stderr, killed, seconds = run_and_act(
        cmd(out, tiny, *extra), out / "checkpoints" / f"step_{step}", kill, timeout, env)
    assert killed is not None, f"the run ended before step {step}:\n{stderr[-3000:]}"
    return code, stdout, stderr, seconds
