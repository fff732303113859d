"""Every party of an evaluation behind one batch call: an OpenAI-compatible server or a local
checkpoint served in-process by vLLM.

`Endpoint.chat(requests)` answers a batch of chats with `n` texts each. Over HTTP the batch runs
as concurrent requests under a semaphore (the `openai` client retries connection errors, 408,
429 and 5xx with exponential backoff); locally it is one `LLM.chat` call, which vLLM batches.
A request the server refuses (a 4xx other than 408/429: a prompt too long, an image a text
model cannot take) fails that request alone, as a `Reply` with `error`; an endpoint that stays
unreachable, or answers with something that is not a chat completion, raises `EndpointError`
naming it, so the run stops with its finished cases saved. API keys are read from the
environment variable the config names, never stored in configs, reports or logs.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import mimetypes
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from peer_rl.config.worker_settings import EngineSettings
from peer_rl.config.credentials import OPENAI_KEY_ENV, check_key_transport, key_variable, redact_text
from peer_rl.models.local import check_model_dir
from peer_rl.prompts.multimodal import for_vllm, is_vision_language

log = logging.getLogger(__name__)


class EndpointError(RuntimeError):
    """An endpoint cannot be used (unreachable, wrong model, malformed answers)."""


@dataclass
class Request:
    messages: list[dict]            # OpenAI-style chat; image parts as {"type": "image", "image": path}
    n: int = 1
    max_tokens: int | None = None   # None: the endpoint's own default
    temperature: float | None = None
    schema: dict | None = None      # JSON schema the answer must follow (structured output)


@dataclass
class Reply:
    texts: list[str] = field(default_factory=list)
    error: str | None = None        # the server refused this request (the others went on)


@dataclass
class EndpointConfig(EngineSettings):
    """One party. Exactly one of `url` (OpenAI-compatible, e.g. http://host:8000/v1) or `path`
    (a Hugging Face model directory, served by an in-process vLLM engine, sized by the
    EngineSettings keys)."""
    url: str = ""
    path: str = ""
    model: str = ""                 # served model name ("" = the only one the server lists)
    # the variable holding this party's API key; "" = OPENAI_API_KEY for https://api.openai.com
    # only, no key for any other URL (peer_rl.config.credentials: a key goes where it is named)
    api_key_env: str = ""
    # a key is never sent over plain http:// to another host unless this says so
    allow_insecure_http: bool = False
    prompt: str = "peer"            # the model under test: peer (Steps 1-4) | chat (as it is)
    # peer prompt's wording: a policy_template.json or a model directory holding one; "" = the
    # one saved in `path` (what the policy was trained on), else the built-in one
    template: str = ""
    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 512
    structured: bool = True         # ask for JSON-schema output where the protocol parses one
    images: bool = True             # send images of visual prompts (text-only models: false)
    max_concurrency: int = 8        # HTTP requests in flight
    timeout_s: float = 120.0        # per HTTP request
    max_retries: int = 4            # per HTTP request, with exponential backoff
    max_requests_per_minute: float = 0.0  # HTTP requests started per minute (0: no limit)
    max_model_len: int = 4096       # local engine


class Endpoint:
    """The batch interface every protocol uses."""
    name: str = ""                  # for messages: "judge (http://host/v1, model m)"
    cfg: EndpointConfig

    def chat(self, requests: list[Request]) -> list[Reply]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def _params(self, r: Request) -> tuple[int, float]:
        return (r.max_tokens or self.cfg.max_tokens,
                self.cfg.temperature if r.temperature is None else r.temperature)


def _data_url(path: str) -> str:
    mime = mimetypes.guess_type(path)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(Path(path).read_bytes()).decode()}"


def without_images(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        if isinstance(m["content"], list):
            text = "".join(p.get("text", "") for p in m["content"] if p.get("type") == "text")
            m = {**m, "content": text}
        out.append(m)
    return out


def _openai_messages(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        if isinstance(m["content"], list):
            parts = [{"type": "image_url", "image_url": {"url": _data_url(p["image"])}}
                     if p.get("type") == "image" else p for p in m["content"]]
            m = {**m, "content": parts}
        out.append(m)
    return out


class HttpEndpoint(Endpoint):
    def __init__(self, role: str, cfg: EndpointConfig):
        import openai  # deferred: openai (only the API endpoints need it)

        self.cfg, self.role = cfg, role
        self._openai = openai
        var = key_variable(cfg.url, cfg.api_key_env)
        key = os.environ.get(var, "") if var else ""
        check_key_transport(f"{role}.url", cfg.url, var if key else "",
                            f"{role}.allow_insecure_http", cfg.allow_insecure_http, EndpointError)
        if key and cfg.url.startswith("http://"):
            log.warning(f"warning: {role}: the key in ${var} goes over plain "
                        f"http to {redact_text(cfg.url)}")
        if not var and os.environ.get(OPENAI_KEY_ENV):
            log.warning(f"{role}: ${OPENAI_KEY_ENV} is not sent to {redact_text(cfg.url)} "
                        f"(not OpenAI's API); set {role}.api_key_env={OPENAI_KEY_ENV} if this "
                        "server should have it")
        self._key = key or "EMPTY"
        self.model = cfg.model or self._only_model()
        self.name = f"{role} ({redact_text(cfg.url)}, model {self.model})"
        self._next_start = 0.0      # monotonic time the next request may start (rate limit)

    def _client(self):
        return self._openai.AsyncOpenAI(base_url=self.cfg.url, api_key=self._key,
                                        timeout=self.cfg.timeout_s,
                                        max_retries=self.cfg.max_retries)

    def _only_model(self) -> str:
        async def ask():
            async with self._client() as client:
                return [m.id async for m in client.models.list()]
        try:
            models = asyncio.run(ask())
        except self._openai.APIError as exc:
            raise EndpointError(redact_text(
                f"{self.role} ({self.cfg.url}): cannot list models ({type(exc).__name__}: "
                f"{exc}); is the server up, and is the URL the /v1 base?")) from None
        if len(models) != 1:
            raise EndpointError(f"{self.role} ({redact_text(self.cfg.url)}) serves "
                                f"{len(models)} models ({', '.join(models[:8])}): set "
                                f"{self.role}.model")
        return models[0]

    async def _one(self, client, sem, r: Request) -> Reply:
        max_tokens, temperature = self._params(r)
        kwargs = {}
        if r.schema is not None and self.cfg.structured:
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "answer", "schema": r.schema}}
        messages = r.messages if self.cfg.images else without_images(r.messages)
        async with sem:
            await self._paced()
            try:
                resp = await client.chat.completions.create(
                    model=self.model, messages=_openai_messages(messages), n=r.n,
                    max_tokens=max_tokens, temperature=temperature, top_p=self.cfg.top_p,
                    **kwargs)
            except self._openai.APIStatusError as exc:
                if exc.status_code in (401, 403, 404):
                    raise EndpointError(f"{self.name}: HTTP {exc.status_code} "
                                        f"({_brief(exc)})") from None
                if 400 <= exc.status_code < 500:
                    return Reply(error=f"HTTP {exc.status_code}: {_brief(exc)}")
                raise EndpointError(f"{self.name}: HTTP {exc.status_code} after "
                                    f"{self.cfg.max_retries} retries") from None
            except (self._openai.APIConnectionError, self._openai.APITimeoutError) as exc:
                raise EndpointError(f"{self.name}: unreachable after {self.cfg.max_retries} "
                                    f"retries ({type(exc).__name__})") from None
            except (self._openai.APIError, ValueError) as exc:   # a body that is no completion
                raise EndpointError(f"{self.name}: malformed answer ({type(exc).__name__}); is "
                                    "the URL an OpenAI-compatible /v1 base?") from None
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list) or len(choices) != r.n or not all(
                isinstance(getattr(getattr(c, "message", None), "content", ""), (str, type(None)))
                for c in choices):
            raise EndpointError(f"{self.name}: expected {r.n} choice(s) in a chat completion, "
                                f"got {type(resp).__name__} with "
                                f"{len(choices) if isinstance(choices, list) else 'no'} choices")
        return Reply(texts=[(c.message.content or "") for c in
                            sorted(choices, key=lambda c: c.index)])

    def chat(self, requests: list[Request]) -> list[Reply]:
        async def run():
            sem = asyncio.Semaphore(self.cfg.max_concurrency)
            async with self._client() as client:
                return await asyncio.gather(*(self._one(client, sem, r) for r in requests))
        return list(asyncio.run(run()))

    async def _paced(self) -> None:
        """Space request starts by 60 / max_requests_per_minute seconds (an API's quota),
        across batches: the next start is kept on the endpoint."""
        rpm = self.cfg.max_requests_per_minute
        if rpm <= 0:
            return
        loop_now = time.monotonic()
        start = max(loop_now, self._next_start)
        self._next_start = start + 60.0 / rpm
        if start > loop_now:
            await asyncio.sleep(start - loop_now)


def _brief(exc) -> str:
    body = getattr(exc, "body", None)
    msg = body.get("message") if isinstance(body, dict) else None
    return str(msg or exc)[:300]


class LocalEndpoint(Endpoint):
    """A checkpoint in an in-process vLLM engine (float32 on CPU, as the rollout workers)."""

    def __init__(self, role: str, cfg: EndpointConfig, seed: int = 0):
        from peer_rl.workers.vllm_engine import make_llm  # deferred: pulls in torch

        check_model_dir(f"{role}.path={cfg.path}", cfg.path, error=EndpointError,
                        example="outputs/<run>/checkpoints/step_N/policy/model")
        self.cfg, self.role = cfg, role
        self.name = f"{role} ({cfg.path})"
        self.vision = is_vision_language(cfg.path)
        self.llm = make_llm(cfg.path, cfg, seed=seed)
        self.max_len = self.llm.llm_engine.model_config.max_model_len
        self.tokenizer = self.llm.get_tokenizer()

    def _messages(self, messages: list[dict]) -> list[dict]:
        if self.vision and self.cfg.images:
            return for_vllm(messages)
        return without_images(messages)

    def _fits(self, r: Request) -> bool:
        text = self.tokenizer.apply_chat_template(without_images(r.messages), tokenize=False,
                                                  add_generation_prompt=True)
        return len(self.tokenizer(text)["input_ids"]) + self._params(r)[0] <= self.max_len

    def chat(self, requests: list[Request]) -> list[Reply]:
        from vllm import SamplingParams  # deferred: vllm
        from vllm.sampling_params import StructuredOutputsParams  # deferred: vllm

        replies: list[Reply | None] = [None] * len(requests)
        todo = []
        for i, r in enumerate(requests):
            if self._fits(r):
                todo.append(i)
            else:   # what a server answers with HTTP 400: this request fails, the batch goes on
                replies[i] = Reply(error=f"prompt + max_tokens exceed max_model_len "
                                         f"{self.max_len}")
        params = []
        for i in todo:
            r = requests[i]
            max_tokens, temperature = self._params(r)
            so = (StructuredOutputsParams(json=r.schema)
                  if r.schema is not None and self.cfg.structured else None)
            params.append(SamplingParams(n=r.n, max_tokens=max_tokens, temperature=temperature,
                                         top_p=self.cfg.top_p, structured_outputs=so))
        if todo:
            outs = self.llm.chat([self._messages(requests[i].messages) for i in todo], params,
                                 use_tqdm=False)
            for i, out in zip(todo, outs):
                replies[i] = Reply(texts=[c.text for c in sorted(out.outputs,
                                                                 key=lambda c: c.index)])
        return replies

    def close(self) -> None:
        from peer_rl.workers.vllm_engine import shutdown  # deferred: pulls in torch

        shutdown(self.llm)


def open_endpoints(specs: dict[str, EndpointConfig], seed: int = 0) -> dict[str, Endpoint]:
    """role -> Endpoint; roles naming the same local checkpoint share one engine."""
    out: dict[str, Endpoint] = {}
    local: dict[str, LocalEndpoint] = {}
    for role, cfg in specs.items():
        if bool(cfg.url) == bool(cfg.path):
            raise EndpointError(f"{role}: set exactly one of {role}.url (an OpenAI-compatible "
                                f"base URL) or {role}.path (a local checkpoint directory)")
        if cfg.url:
            out[role] = HttpEndpoint(role, cfg)
            continue
        key = str(Path(cfg.path).resolve())
        if key not in local:
            local[key] = LocalEndpoint(role, cfg, seed=seed)
        out[role] = local[key] if local[key].cfg == cfg else _SharedEngine(role, cfg, local[key])
    return out


class _SharedEngine(LocalEndpoint):
    """A second role on an engine already loaded, with its own sampling settings."""

    def __init__(self, role: str, cfg: EndpointConfig, engine: LocalEndpoint):
        self.cfg, self.role, self.name = cfg, role, f"{role} ({cfg.path})"
        self.vision, self.llm = engine.vision, engine.llm
        self.max_len, self.tokenizer = engine.max_len, engine.tokenizer

    def close(self) -> None:
        pass    # the engine's owner closes it


def close_all(endpoints: dict[str, Endpoint]) -> None:
    for ep in endpoints.values():
        ep.close()
