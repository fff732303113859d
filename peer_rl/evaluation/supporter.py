"""The model under test as a supporter: what it is asked, and what of its answer a seeker sees.

`peer` style: the policy prompt peer-rl trains with (Steps 1-4, peer_rl.reasoning); the seeker
sees Step 4 only and the transcript keeps the whole answer. When Step 4 is missing the seeker
sees the answer without its step markers and the turn counts as a format miss.
`chat` style: a plain chat model as it is (baselines): a short system prompt, the dialogue as
alternating turns, the whole answer (minus a `<think>` block) shown.
"""
from __future__ import annotations

from peer_rl.evaluation.endpoints import Request
from peer_rl.evaluation.parse import strip_think
from peer_rl.multimodal import attach_images
from peer_rl.reasoning import parse_structured, policy_messages

STYLES = ("peer", "chat")
_SYSTEM = {"en": "You are a warm, caring friend who offers emotional support. Reply briefly "
                 "and naturally, as in a chat.",
           "zh": "你是一位温暖、体贴的朋友，为对方提供情感支持。像聊天一样简短自然地回复。"}


def chat_messages(history: list[dict], lang: str) -> list[dict]:
    """System prompt + the dialogue; consecutive seeker turns become one user turn."""
    msgs = [{"role": "system", "content": _SYSTEM[lang]}]
    for t in history:
        role = "user" if t["role"] == "seeker" else "assistant"
        if msgs[-1]["role"] == role:
            msgs[-1] = {**msgs[-1], "content": msgs[-1]["content"] + "\n" + t["content"]}
        else:
            msgs.append({"role": role, "content": t["content"]})
    return msgs


def supporter_request(style: str, history: list[dict], lang: str, images=(), n: int = 1,
                      messages: list[dict] | None = None) -> Request:
    """`messages` (peer style only) replaces the rebuilt prompt: GRPO test rows carry theirs."""
    if style == "peer":
        msgs = list(messages) if messages else policy_messages(history, lang, visual=bool(images))
    elif style == "chat":
        msgs = chat_messages(history, lang)
    else:
        raise ValueError(f"model.prompt={style!r}: expected one of {STYLES}")
    if images:
        msgs = attach_images(msgs, list(images))
    return Request(msgs, n=n)


def shown_reply(text: str, style: str) -> tuple[str, bool | None]:
    """(what the seeker reads, whether Step 4 was found: None in chat style)."""
    text = strip_think(text)
    if style == "chat":
        return text.strip(), None
    parsed = parse_structured(text)
    reply = parsed.steps.get(4, "").strip()
    if reply:
        return reply, True
    # no Step 4: drop whatever step bodies precede the text the model did write
    leftover = parsed.steps[max(parsed.steps)] if parsed.steps else text
    return leftover.strip(), False
