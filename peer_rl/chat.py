"""`peer-rl chat MODEL`: a person talks to a checkpoint or an endpoint in the terminal.

The same endpoints and prompts as the evaluations: with the peer prompt the model reasons in
Steps 1-4 and only Step 4 is printed, unless reasoning is shown (`--show-reasoning`, or
`/reasoning` to toggle). `/reset` starts a new conversation, `/quit` (or end of input) leaves.
"""
from __future__ import annotations

import sys

from peer_rl.evaluation.endpoints import EndpointConfig, close_all, open_endpoints
from peer_rl.evaluation.supporter import shown_reply, supporter_request

HELP = "/reasoning: show or hide Steps 1-3 | /reset: new conversation | /quit: leave"


def chat_loop(args, stdin=None, stdout=None) -> int:
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    url = args.model.startswith(("http://", "https://"))
    cfg = EndpointConfig(url=args.model if url else "", path="" if url else args.model,
                         model=args.model_name, api_key_env=args.api_key_env,
                         prompt=args.prompt, temperature=args.temperature,
                         max_tokens=args.max_tokens, kv_cache_gib=args.kv_cache_gib)
    endpoint = open_endpoints({"model": cfg})
    show, history = args.show_reasoning, []
    interactive = stdin.isatty()
    print(f"peer-rl chat with {endpoint['model'].name}. {HELP}", file=stdout, flush=True)
    try:
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
            reply = endpoint["model"].chat([supporter_request(args.prompt, history,
                                                              args.lang)])[0]
            if reply.error:
                print(f"(the model refused the request: {reply.error}; /reset to start over)",
                      file=stdout, flush=True)
                history.pop()
                continue
            raw = reply.texts[0]
            said, step4 = shown_reply(raw, args.prompt)
            history.append({"role": "supporter", "content": said})
            if show and args.prompt == "peer":
                print(f"[reasoning]\n{raw.strip()}\n[/reasoning]", file=stdout)
            if step4 is False:
                print("(no Step 4 in the answer: showing what it wrote)", file=stdout)
            print(f"supporter> {said}", file=stdout, flush=True)
    finally:
        close_all(endpoint)
    return 0
