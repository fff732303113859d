"""A real vLLM OpenAI-compatible server on 127.0.0.1 with the tiny policy, once per session."""
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` as a user starts it; stop() kills it the
    way a crash would (SIGKILL of its process group), start() brings it back on the same port."""

    def __init__(self, model: str, log_dir):
        self.model, self.log_dir, self.proc = model, log_dir, None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 240) -> None:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        log = open(self.log_dir / f"server_{time.time():.0f}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
             "--served-model-name", "tiny-policy", "--host", "127.0.0.1", "--port",
             str(self.port), "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
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
