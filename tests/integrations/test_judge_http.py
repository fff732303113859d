"""The verl plug-in's judge client against a real HTTP server (http.server in a thread) that
answers 200 with bodies that are no chat completion: each is retried, a good answer after them
is used, and the last attempt's failure names the endpoint and what the body lacked."""
import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from peer_rl.integrations.judge_http import HttpJudge, JudgeUnreachable

GOOD = json.dumps({"choices": [{"message": {"role": "assistant", "content": "Yes"}}]})
BAD = {   # body -> the words the final error must carry
    "error": (json.dumps({"error": {"message": "server overloaded", "code": 503}}),
              "carries an error", "server overloaded"),
    "empty_choices": (json.dumps({"choices": []}), "'choices' is []", "non-empty list"),
    "truncated": (GOOD[:25], "not JSON", "at char 25 of 25"),
    "list_content": (json.dumps({"choices": [{"message": {"content": [
        {"type": "text", "text": "Yes"}]}}]}), "content is a list", "expected a string"),
    "no_message": (json.dumps({"choices": [{"text": "Yes"}]}), "no 'message'", "choices[0]"),
    "not_object": (json.dumps(["Yes"]), "JSON list", "not an object"),
}


class Script:
    """The bodies the server answers, in order (the last one repeats); requests counted."""

    def __init__(self, bodies: list[str]):
        self.bodies, self.requests = bodies, 0

    def next(self) -> str:
        body = self.bodies[min(self.requests, len(self.bodies) - 1)]
        self.requests += 1
        return body


@pytest.fixture
def server():
    script = Script([GOOD])

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            data = script.next().encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield httpd, script
    httpd.shutdown()
    httpd.server_close()


def judge(httpd, retries: int) -> HttpJudge:
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    return HttpJudge(url, "peer-judge", timeout_s=5, retries=retries, backoff_s=0.01)


def ask(j: HttpJudge) -> str:
    return asyncio.run(j.answer([{"role": "user", "content": "Is it empathetic?"}], 4))


def test_a_good_answer_is_read(server):
    httpd, script = server
    script.bodies = [GOOD]
    assert ask(judge(httpd, retries=3)) == "Yes" and script.requests == 1


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_200_is_retried_then_the_good_answer_used(server, case):
    httpd, script = server
    script.bodies = [BAD[case][0], BAD[case][0], GOOD]
    assert ask(judge(httpd, retries=3)) == "Yes"
    assert script.requests == 3


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_judge_that_only_answers_malformed_fails_naming_endpoint_and_problem(server, case):
    httpd, script = server
    body, *words = BAD[case]
    script.bodies = [body]
    with pytest.raises(JudgeUnreachable) as err:
        ask(judge(httpd, retries=2))
    msg = str(err.value)
    assert f"127.0.0.1:{httpd.server_address[1]}/v1/chat/completions" in msg
    assert "2 attempt(s)" in msg and script.requests == 2
    for w in words:
        assert w in msg, (w, msg)


def test_a_malformed_model_list_is_retried_and_named(server):
    httpd, script = server
    script.bodies = [json.dumps({"data": None}), json.dumps({"data": [
        {"id": "peer-judge", "max_model_len": 2048}]})]
    j = judge(httpd, retries=2)
    j.model = None
    assert asyncio.run(j.served())["max_model_len"] == 2048 and j.model == "peer-judge"
    script.bodies, script.requests = [json.dumps({"object": "list"})], 0
    with pytest.raises(JudgeUnreachable, match=r"/v1/models .*'data' is null"):
        asyncio.run(judge(httpd, retries=2).served())
