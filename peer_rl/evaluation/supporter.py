"""The model under test as a supporter: what it is asked, and what of its answer a seeker sees.

`peer` style: the policy prompt the model was trained with (Steps 1-4): the template saved
with it (peer_rl.prompts.policy, read off its training rows), else the built-in one; the seeker
sees the reply as training reads it (peer_rl.prompts.reasoning.parse_structured: Step 4, or without a
Step 4 the last labelled step's body) and the transcript keeps the whole answer; a turn without
a non-empty Step 4 counts as a format miss.
`chat` style: a plain chat model as it is (baselines): a short system prompt, the dialogue as
alternating turns, the whole answer (minus a `<think>` block) shown.
`escrag` style: ESCRAG-R1's therapist prompt (peer_rl.prompts.escrag); the seeker sees what
follows `</think>`. With retrieval (`rag.index`, `--rag DIR`) a turn is ESCRAG-R1's RAG
inference: the initial reply queries the exemplar index (role "retrieval") and the model writes
the refined reply from the dialogue, its initial reply and the exemplars; no weights change.

`supporter_turn` is the one place a protocol asks the model under test for a turn:
`turns = yield from supporter_turn(...)`.
"""
from __future__ import annotations

from typing import NamedTuple

from peer_rl.prompts.escrag import initial_messages, parse_reasoned, refined_messages
from peer_rl.evaluation.endpoints import Request
from peer_rl.prompts.answers import strip_think
from peer_rl.prompts.multimodal import attach_images
from peer_rl.prompts.policy import PolicyTemplate
from peer_rl.prompts.reasoning import parse_structured

STYLES = ("peer", "chat", "escrag")


class Supporter(NamedTuple):
    """How the model under test is asked: a style, and for `peer` the policy template."""
    style: str
    template: PolicyTemplate | None = None


def as_supporter(style: "str | Supporter") -> Supporter:
    return style if isinstance(style, Supporter) else Supporter(style)


class Query(NamedTuple):
    """A retrieval request: the exemplar index's key is (dialogue, initial reply); `dialogue`,
    where the case has one, is its dialogue id (exemplars carrying it are never returned)."""
    history: list[dict]
    reply: str
    k: int
    dialogue: str | None = None


class Turn(NamedTuple):
    raw: str                      # the model's whole answer (the refined pass's, with RAG)
    shown: str                    # what the seeker reads
    format_ok: bool | None        # peer: a non-empty Step 4; escrag: complete; chat: None
    initial_raw: str | None = None        # RAG: the first pass's answer
    exemplars: tuple[str, ...] = ()       # RAG: what retrieval returned
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


def supporter_request(style: "str | Supporter", history: list[dict], lang: str, images=(), n: int = 1,
                      messages: list[dict] | None = None) -> Request:
    """`messages` (peer style only) replaces the rebuilt prompt: GRPO test rows carry theirs."""
    style, template = as_supporter(style)
    if style == "peer":
        msgs = list(messages) if messages else (template or PolicyTemplate()).messages(
            history, lang, visual=bool(images))
    elif style == "escrag":
        msgs = initial_messages(history, lang)
    elif style == "chat":
        msgs = chat_messages(history, lang)
    else:
        raise ValueError(f"model.prompt={style!r}: expected one of {STYLES}")
    if images:
        msgs = attach_images(msgs, list(images))
    return Request(msgs, n=n)


def supporter_turn(style: "str | Supporter", history: list[dict], lang: str, n: int = 1, images=(),
                   messages: list[dict] | None = None, rag_k: int = 0):
    """Yield the model's (and retrieval's) requests; return the n Turns. `rag_k` > 0 (escrag
    style only) runs the two passes with that many exemplars."""
    supporter = as_supporter(style)
    style = supporter.style
    if rag_k and style != "escrag":
        raise ValueError(f"RAG inference needs the escrag prompt, not model.prompt={style!r}")
    texts = yield "model", supporter_request(supporter, history, lang, images, n, messages)
    if not rag_k:
        return [Turn(t, *shown_reply(t, style)) for t in texts]
    first = [parse_reasoned(t).reply for t in texts]
    found = yield "retrieval", [Query(history, f, rag_k) for f in first]
    second = yield "model", [Request(refined_messages(history, lang, f, ex)) for f, ex in
                             zip(first, found)]
    return [Turn(t2[0], *shown_reply(t2[0], style), initial_raw=t1, exemplars=tuple(ex))
            for t1, ex, t2 in zip(texts, found, second)]


def shown_reply(text: str, style: str) -> tuple[str, bool | None]:
    """(what the seeker reads, whether the style's format was complete: None in chat style)."""
    if style == "escrag":
        parsed = parse_reasoned(text)
        return parsed.reply, parsed.complete
    text = strip_think(text)
    if style == "chat":
        return text.strip(), None
    parsed = parse_structured(text)          # the reading training uses (peer_rl.prompts.reasoning)
    return parsed.reply, parsed.has_step4


def turn_record(turn: Turn) -> dict:
    """A turn as a case record stores it (RAG fields only when retrieval ran)."""
    out = {"model_raw": turn.raw, "reply": turn.shown, "format_ok": turn.format_ok}
    if turn.initial_raw is not None:
        out |= {"initial_raw": turn.initial_raw, "exemplars": list(turn.exemplars)}
    return out
