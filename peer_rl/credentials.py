"""Credentials: which endpoint is sent an API key, and keeping keys and URL userinfo out of the
files a run writes and the messages it prints.

A key goes only where the user named it: an endpoint's own `api_key_env` (the variable holding
its key), or OPENAI_API_KEY to OpenAI's own API over https. Any other URL (a lab's vLLM server,
a colleague's gateway) gets no key unless its `api_key_env` says which one, so a key set for
OpenAI never travels to a third party by default.
"""
from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

OPENAI_KEY_ENV = "OPENAI_API_KEY"
OPENAI_HOST = "api.openai.com"
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def key_variable(url: str, api_key_env: str) -> str:
    """The environment variable whose value `url` is sent as its API key; "" = none."""
    if api_key_env:
        return api_key_env
    parts = urlsplit(url)
    if parts.scheme == "https" and (parts.hostname or "").lower() == OPENAI_HOST:
        return OPENAI_KEY_ENV
    return ""


def redact_url(url: str) -> str:
    """The URL without the credentials it may carry (https://user:secret@host/v1)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def redact_text(text: str) -> str:
    """`text` with the userinfo of every URL in it replaced by ***."""
    return _USERINFO.sub(lambda m: m["scheme"] + "***@", text)
