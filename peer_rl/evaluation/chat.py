"""`peer-rl chat MODEL`: a person talks to a checkpoint or an endpoint in the terminal.

The same endpoints, prompts and turn logic as the evaluations (supporter_turn): with the peer
prompt the model reasons in Steps 1-4 and only Step 4 is printed; with the escrag prompt what
follows `</think>`; `--rag INDEX` adds ESCRAG-R1's retrieval pass (initial reply -> exemplars ->
refined reply). Reasoning is shown with `--show-reasoning`, or `/reasoning` to toggle. `/reset`
starts a new conversation, `/quit` (or end of input) leaves.
"""
from __future__ import annotations

import re
import sys
from typing import NamedTuple

from peer_rl.evaluation.endpoints import EndpointConfig, close_all, open_endpoints
from peer_rl.evaluation.retriever import LocalRetriever
from peer_rl.evaluation.runner import run_all
from peer_rl.evaluation.supporter import Supporter, supporter_turn
from peer_rl.prompts.policy import PolicyTemplate

HELP = "/reasoning: show or hide the reasoning | /reset: new conversation | /quit: leave"
# ANSI/VT escape sequences (CSI, OSC, single-character escapes) and other C0/C1 controls but
# tab and newline: a model's text must not move the cursor, retitle the terminal or hide lines
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?|"
                      r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Model output as plain text for the terminal."""
    return _CONTROL.sub("", text)


class _Case(NamedTuple):
    id: str


def ask(endpoints: dict, style, history: list[dict], lang: str, rag_k: int = 0):
    """One supporter turn through the evaluation runner: (Turn, None) or (None, error)."""
    def program(_):
        turns = yield from supporter_turn(style, history, lang, rag_k=rag_k)
        return {"turn": turns[0]}

    rec = run_all([_Case("chat")], program, endpoints, 1)[0]
    return rec.get("turn"), rec.get("error")


def chat_loop(args, stdin=None, stdout=None) -> int:
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    url = args.model.startswith(("http://", "https://"))
    style = "escrag" if args.rag else args.prompt
    cfg = EndpointConfig(url=args.model if url else "", path="" if url else args.model,
                         model=args.model_name, api_key_env=args.api_key_env,
                         prompt=style, temperature=args.temperature,
                         max_tokens=args.max_tokens, kv_cache_gib=args.kv_cache_gib)

    # a local policy is asked as it was trained (the template saved beside its weights)
    supporter = Supporter(style, PolicyTemplate.load(None if url else args.model)
                          if style == "peer" else None)
    endpoints = open_endpoints({"model": cfg})
    try:
        if args.rag:
            endpoints["retrieval"] = LocalRetriever(args.rag)
        show, history = args.show_reasoning, []
        interactive = stdin.isatty()
        rag = f", RAG from {endpoints['retrieval'].name}" if args.rag else ""
        print(f"peer-rl chat with {endpoints['model'].name} ({style} prompt{rag}). {HELP}",
              file=stdout, flush=True)
        while True:
            if interactive:
                print("you> ", end="", file=stdout, flush=True)
            line = stdin.readline()
            if not line or line.strip() == "/quit":
                break
            text = line.strip()
            if not text:
                continue
            if text == "/reasoning":
                show = not show
                print(f"(reasoning {'shown' if show else 'hidden'})", file=stdout, flush=True)
                continue
            if text == "/reset":
                history = []
                print("(new conversation)", file=stdout, flush=True)
                continue
            history.append({"role": "seeker", "content": text})
            turn, error = ask(endpoints, supporter, history, args.lang,
                              args.rag_k if args.rag else 0)
            if error:
                print(f"(the model refused the request: {error}; /reset to start over)",
                      file=stdout, flush=True)
                history.pop()
                continue
            history.append({"role": "supporter", "content": turn.shown})
            if show and style != "chat":
                if turn.initial_raw is not None:
                    print(f"[initial]\n{printable(turn.initial_raw.strip())}\n[/initial]", file=stdout)
                    for i, ex in enumerate(turn.exemplars, 1):
                        print(f"[exemplar {i}] {printable(str(ex))}", file=stdout)
                print(f"[reasoning]\n{printable(turn.raw.strip())}\n[/reasoning]", file=stdout)
            if turn.format_ok is False:
                print("(the answer is not in the prompt's format: showing what it wrote)",
                      file=stdout)
            print(f"supporter> {printable(turn.shown)}", file=stdout, flush=True)
    finally:
        close_all(endpoints)
    return 0
