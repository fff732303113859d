"""Credentials: which server is sent which key, over what, and keeping keys and URL userinfo out
of the files a run writes and the lines it prints.

A key goes only to the server named for it. An evaluation party's or judge's key: the variable
its `api_key_env` names, else OPENAI_API_KEY to OpenAI's own API over https; any other URL (a
lab's vLLM server, a colleague's gateway) gets no key. The MLflow tracker's token: the variable
`trainer.mlflow.token_env` names, else MLFLOW_TRACKING_TOKEN (with MLFLOW_TRACKING_USERNAME and
_PASSWORD) to the server $MLFLOW_TRACKING_URI names, the one it was set beside; a tracking URI a
recipe names elsewhere gets none. Either way a credential never crosses plain http:// to another
host unless the setting's `allow_insecure_http` says so (`check_key_transport`, for both).

Every line printed and every file written passes `redact_text` (a URL's user:password as ***);
a config passes `peer_rl.config.schema.public_config`, which resolves it first and writes a value that
read the environment as its interpolation, whichever key reached it.
"""
from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

OPENAI_KEY_ENV = "OPENAI_API_KEY"
OPENAI_URL = "https://api.openai.com"
# scheme://, then the authority's userinfo up to its last @ (a password may hold @, ? or #)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s]*@")
_PORTS = {"http": 80, "https": 443}


def key_variable(url: str, named: str, default_var: str = OPENAI_KEY_ENV,
                 default_url: str = OPENAI_URL) -> str:
    """The environment variable whose value `url` is sent as its key; "" = none. `named` (the
    setting naming it) when set, else `default_var` when `url` is on `default_url`'s server
    (scheme, host and port alike)."""
    if named:
        return named
    return default_var if default_url and _server(url) == _server(default_url) else ""


def _server(url: str) -> tuple:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:               # not a port: no server to match
        return ("", url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), port or _PORTS.get(scheme)


def check_key_transport(url_key: str, url: str, variable: str, allow_key: str, allowed: bool,
                        error: type[Exception] = ValueError) -> None:
    """A credential goes over https, or plain http to this machine only, unless `allow_key`
    (`allowed`) says so. `variable`: the environment variable whose (set) value `url` would be
    sent, "" = none; a URL's own user:password counts as a credential too."""
    parts = urlsplit(url)
    what = f"the key in ${variable}" if variable else \
        "the URL's user:password" if "@" in parts.netloc else ""
    if parts.scheme != "http" or not what or allowed:
        return
    host = parts.hostname or ""
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = host == "localhost"
    if not local:
        raise error(f"{url_key}={redact_text(url)}: {what} would be sent in the clear to "
                    f"{host}; use https, unset it, or set {allow_key}=true")


def redact_text(text: str) -> str:
    """`text` with the user:password of every URL in it replaced by *** (the one redaction of
    printed lines; a config's values pass it too, in peer_rl.config.schema.public_config)."""
    return _USERINFO.sub(lambda m: m["scheme"] + "***@", text)
