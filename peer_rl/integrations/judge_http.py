"""The judge behind an OpenAI-compatible server, as the verl plug-in asks it: greedy chat
completions, every answer checked before it is used.

A server can answer HTTP 200 with a body that is no completion: an `error` object (some
gateways report overload so), no `choices`, JSON cut off mid-stream, a `content` that is not a
string. Such a body is retried like a refused connection or a 5xx, with backoff; after the last
attempt `JudgeUnreachable` names the endpoint and what was wrong with the last answer. A 4xx is
our request's fault and is not retried. This module imports no verl, so it is tested in the main
environment against a real HTTP server.
"""
from __future__ import annotations

import asyncio
import json

from peer_rl.config.credentials import redact_text


class JudgeUnreachable(RuntimeError):
    """The judge gave no usable answer (no connection, 5xx, malformed body) after every attempt."""


class MalformedAnswer(ValueError):
    """A 200 answer whose body is not what the endpoint promises (retried)."""


def completion_text(body) -> str:
    """The first choice's message content of a chat completion body; `MalformedAnswer` naming
    the problem otherwise. A null content (no text generated) is the empty string."""
    if not isinstance(body, dict):
        raise MalformedAnswer(f"body is a JSON {type(body).__name__}, not an object")
    if body.get("error") is not None:
        raise MalformedAnswer(f"body carries an error: {json.dumps(body['error'])[:300]}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedAnswer(f"'choices' is {json.dumps(choices)[:100]}, expected a non-empty list")
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        raise MalformedAnswer("choices[0] has no 'message' object")
    content = message.get("content")
    if content is None:
        return ""
    if not isinstance(content, str):
        raise MalformedAnswer(f"choices[0].message.content is a {type(content).__name__}, "
                              "expected a string")
    return content


def model_cards(body) -> list[dict]:
    """The `data` list of a /v1/models body; `MalformedAnswer` otherwise."""
    if not isinstance(body, dict):
        raise MalformedAnswer(f"body is a JSON {type(body).__name__}, not an object")
    if body.get("error") is not None:
        raise MalformedAnswer(f"body carries an error: {json.dumps(body['error'])[:300]}")
    cards = body.get("data")
    if not isinstance(cards, list) or not all(isinstance(c, dict) for c in cards):
        raise MalformedAnswer(f"'data' is {json.dumps(cards)[:100]}, expected a list of objects")
    return cards


class HttpJudge:
    """Chat completions from an OpenAI-compatible judge server, greedy, retried with backoff
    (`backoff_s` x 2^attempt, at most 30 s) on connection errors, 5xx and malformed bodies."""

    def __init__(self, url: str, model: str | None, timeout_s: float, retries: int,
                 backoff_s: float = 1.0):
        self.url, self.model = url.rstrip("/"), model
        self.shown = redact_text(self.url)      # messages never carry the URL's credentials
        self.timeout_s, self.retries, self.backoff_s = timeout_s, max(1, retries), backoff_s

    async def _request(self, method: str, path: str, body: dict | None, parse):
        """`parse(json body)` of the first usable answer."""
        import aiohttp  # deferred: aiohttp (only the HTTP endpoints need it)

        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        last = ""
        for attempt in range(self.retries):
            try:
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    async with session.request(method, self.url + path, json=body) as resp:
                        if 400 <= resp.status < 500:     # our request is wrong: no retry
                            raise ValueError(f"judge at {self.shown}{path} refused the request: "
                                             f"HTTP {resp.status} {await resp.text()}")
                        resp.raise_for_status()
                        text = await resp.text()
                try:
                    return parse(json.loads(text))
                except json.JSONDecodeError as exc:
                    raise MalformedAnswer(f"body is not JSON ({exc.msg} at char {exc.pos} of "
                                          f"{len(text)}): {text[:120]!r}") from exc
            except (aiohttp.ClientError, asyncio.TimeoutError, MalformedAnswer) as exc:
                last = redact_text(f"{type(exc).__name__}: {exc}")
                if attempt + 1 < self.retries:
                    await asyncio.sleep(min(self.backoff_s * 2 ** attempt, 30))
        raise JudgeUnreachable(f"judge at {self.shown}{path} gave no usable answer after "
                               f"{self.retries} attempt(s); last: {last}")

    async def served(self) -> dict:
        """The server's model card (vLLM's carries max_model_len); picks the only model when
        none was named."""
        cards = await self._request("GET", "/models", None, model_cards)
        if self.model is None:
            if len(cards) != 1:
                raise ValueError(f"judge at {self.shown} serves {len(cards)} models "
                                 f"({[c.get('id') for c in cards]}): set "
                                 "reward.reward_kwargs.judge_model")
            self.model = cards[0].get("id")
        return next((c for c in cards if c.get("id") == self.model), {})

    async def answer(self, messages: list[dict], max_tokens: int) -> str:
        return await self._request("POST", "/chat/completions", {
            "model": self.model, "messages": messages, "temperature": 0.0,
            "max_tokens": max_tokens}, completion_text)
