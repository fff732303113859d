"""`peer-rl chat`: talk to a model in the terminal."""
from __future__ import annotations


def _errors() -> dict:
    from peer_rl.evaluation.endpoints import EndpointError  # deferred (--help)

    return {EndpointError: 3}


def _chat(args) -> int:
    from peer_rl.evaluation.chat import chat_loop  # deferred (--help)

    return chat_loop(args)


def register(sub) -> None:
    p = sub.add_parser("chat", help="talk to a model in the terminal (the reply shown; "
                       "/reasoning toggles the rest)")
    p.add_argument("model", help="a local model directory or an OpenAI-compatible base URL")
    p.add_argument("--model-name", default="", help="served model name (URL endpoints)")
    p.add_argument("--api-key-env", default="",
                   help="the variable holding the URL's API key (default: OPENAI_API_KEY for "
                        "https://api.openai.com only, no key for any other URL)")
    p.add_argument("--prompt", default="peer", choices=["peer", "chat", "escrag"])
    p.add_argument("--rag", default="", metavar="INDEX_DIR",
                   help="ESCRAG-R1 RAG inference with this exemplar index (implies "
                        "--prompt escrag)")
    p.add_argument("--rag-k", type=int, default=3)
    p.add_argument("--lang", default="en", choices=["en", "zh"])
    p.add_argument("--show-reasoning", action="store_true")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.set_defaults(fn=_chat, errors=_errors)
