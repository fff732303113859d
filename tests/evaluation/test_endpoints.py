"""The HTTP party against a real socket: a stdlib server that misbehaves on purpose."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from peer_rl.evaluation.endpoints import (EndpointConfig, EndpointError, HttpEndpoint, Request,
                                          open_endpoints)


def _completion(n):
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": i, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"answer {i}"}}
                        for i in range(n)]}


class _Server:
    """Answers /v1/chat/completions from a script: a list of (status, body) per call."""

    def __init__(self, script):
        self.script, self.calls, self.headers, self.times = list(script), [], [], []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, status, body):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls.append(body)
                outer.times.append(time.monotonic())
                outer.headers.append({k.lower(): v for k, v in self.headers.items()})
                status, reply = outer.script.pop(0) if outer.script else (200, None)
                self._send(status, reply if reply is not None else _completion(body.get("n", 1)))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def server(request):
    s = _Server(getattr(request, "param", []))
    yield s
    s.close()


def _endpoint(url, **kw):
    return HttpEndpoint("judge", EndpointConfig(url=url, max_retries=2, timeout_s=5, **kw))


def test_the_only_served_model_is_used_and_the_key_comes_from_the_named_variable(server,
                                                                                   monkeypatch):
    monkeypatch.setenv("MY_EVAL_KEY", "sk-secret-123")
    ep = _endpoint(server.url, api_key_env="MY_EVAL_KEY")
    [reply] = ep.chat([Request([{"role": "user", "content": "hi"}], n=2,
                               schema={"type": "object"})])
    assert reply.texts == ["answer 0", "answer 1"] and ep.model == "m"
    assert server.headers[0]["authorization"] == "Bearer sk-secret-123"
    assert server.calls[0]["response_format"]["type"] == "json_schema"
    assert "sk-secret-123" not in ep.name and "sk-secret" not in repr(ep.cfg)


def test_an_openai_key_is_not_sent_to_a_server_it_was_not_named_for(server, monkeypatch,
                                                                       capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-777")
    ep = _endpoint(server.url)
    ep.chat([Request([{"role": "user", "content": "hi"}], n=1)])
    assert all(h["authorization"] == "Bearer EMPTY" for h in server.headers)
    assert "$OPENAI_API_KEY is not sent to" in capsys.readouterr().err
    _endpoint(server.url, api_key_env="OPENAI_API_KEY").chat(
        [Request([{"role": "user", "content": "hi"}], n=1)])
    assert server.headers[-1]["authorization"] == "Bearer sk-openai-777"


@pytest.mark.parametrize("server", [[(429, {"error": {"message": "slow down"}}),
                                     (503, {"error": {"message": "busy"}})]], indirect=True)
def test_429_and_5xx_are_retried_with_backoff(server):
    [reply] = _endpoint(server.url).chat([Request([{"role": "user", "content": "hi"}])])
    assert reply.texts == ["answer 0"] and len(server.calls) == 3
    # the OpenAI client's exponential backoff (0.5 s, then 1 s, each less up to 25% jitter):
    # a retry that does not wait, or waits the same each time, fails here
    first, second = (b - a for a, b in zip(server.times, server.times[1:]))
    assert 0.3 < first < second, (first, second)


@pytest.mark.parametrize("server", [[(400, {"error": {"message": "prompt too long"}})]],
                         indirect=True)
def test_a_refused_request_fails_alone(server):
    replies = _endpoint(server.url, max_concurrency=1).chat(
        [Request([{"role": "user", "content": "long"}]), Request([{"role": "user", "content": "ok"}])])
    assert replies[0].error.startswith("HTTP 400: prompt too long") and replies[0].texts == []
    assert replies[1].texts == ["answer 0"]


@pytest.mark.parametrize("server", [[(200, "<html>not an API</html>")]], indirect=True)
def test_garbage_answers_raise_naming_the_endpoint(server):
    with pytest.raises(EndpointError, match=r"judge \(http://127\.0\.0\.1:\d+/v1, model m\)"):
        _endpoint(server.url).chat([Request([{"role": "user", "content": "hi"}])])


def test_an_unreachable_endpoint_raises_naming_it():
    import socket

    with socket.socket() as s:          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EndpointError, match=rf"judge \(http://127.0.0.1:{port}/v1\): cannot "
                                            "list models"):
        _endpoint(f"http://127.0.0.1:{port}/v1")
    ep = HttpEndpoint("judge", EndpointConfig(url=f"http://127.0.0.1:{port}/v1", model="m",
                                              max_retries=1, timeout_s=2))
    with pytest.raises(EndpointError, match="unreachable after 1 retries"):
        ep.chat([Request([{"role": "user", "content": "hi"}])])


def test_each_party_needs_exactly_one_of_url_or_path():
    with pytest.raises(EndpointError, match="seeker: set exactly one of seeker.url"):
        open_endpoints({"seeker": EndpointConfig()})
    with pytest.raises(EndpointError, match="model.path=/nowhere: no config.json"):
        open_endpoints({"model": EndpointConfig(path="/nowhere")})
