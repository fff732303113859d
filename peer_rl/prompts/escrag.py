"""The ESCRAG-R1 policy prompt (two passes) and its reasoning-response format.

The policy is a therapist who reasons before replying: `<think>reasoning</think>` then the
reply the client reads. Pass 1 sees the dialogue; pass 2 sees the dialogue, its own initial
reply and the retrieved exemplars ("guidelines from an external library") and writes the refined
reply, which is what the reward scores and the client reads.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from peer_rl.prompts.reasoning import render_history

_SYSTEM = {
    "en": ("You are a therapist helping a client reduce emotional distress and work through "
           "their challenges. Before you reply, think through your reasoning inside "
           "<think></think>: the counseling stage, the client's psychological state and the "
           "strategy that fits. Then write the reply the client will read: warm, natural, "
           "concise, no lecturing."),
    "zh": ("你是一位心理咨询师，帮助来访者缓解情绪困扰、应对困难。回复前，先在<think></think>中思考："
           "当前的咨询阶段、来访者的心理状态以及合适的策略。然后写出来访者将看到的回复：温暖、自然、简洁，"
           "不说教。"),
}
_INITIAL = {
    "en": "The conversation so far:\n{history}\n\nThink in <think></think>, then reply.",
    "zh": "目前的对话：\n{history}\n\n先在<think></think>中思考，再回复。",
}
_REFINED = {
    "en": ("The conversation so far:\n{history}\n\nYour initial response:\n{initial}\n\n"
           "Guidelines from an external library (replies counselors preferred in similar "
           "moments):\n{exemplars}\n\nUse what helps from the guidelines, keep your own voice "
           "and the client's specifics. Think in <think></think>, then write your final "
           "response."),
    "zh": ("目前的对话：\n{history}\n\n你的初始回复：\n{initial}\n\n"
           "来自外部资料库的参考（类似情境中更受认可的咨询师回复）：\n{exemplars}\n\n"
           "借鉴其中有用的部分，保持你自己的表达和来访者的具体情况。先在<think></think>中思考，"
           "再写出你的最终回复。"),
}


def initial_messages(history: list[dict], lang: str) -> list[dict]:
    return [{"role": "system", "content": _SYSTEM[lang]},
            {"role": "user", "content": _INITIAL[lang].format(
                history=render_history(history, lang))}]


def refined_messages(history: list[dict], lang: str, initial_reply: str,
                   exemplars: list[str]) -> list[dict]:
    listed = "\n".join(f"{i + 1}. {e}" for i, e in enumerate(exemplars)) or "(none)"
    return [{"role": "system", "content": _SYSTEM[lang]},
            {"role": "user", "content": _REFINED[lang].format(
                history=render_history(history, lang), initial=initial_reply,
                exemplars=listed)}]


def format_reasoned(reasoning: str, reply: str) -> str:
    return f"<think>{reasoning.strip()}</think>\n{reply.strip()}"


_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


class Reasoned(NamedTuple):
    reasoning: str
    reply: str
    complete: bool        # one closed think block, then a non-empty reply


def parse_reasoned(text: str) -> Reasoned:
    """The reply is what follows the last `</think>`; without one the whole text minus any
    unclosed `<think>` part is the reply and the format is incomplete."""
    if "</think>" in text:
        head, _, tail = text.rpartition("</think>")
        m = _THINK.search(head + "</think>")
        reasoning = m.group(1).strip() if m else head.replace("<think>", "").strip()
        return Reasoned(reasoning, tail.strip(), bool(tail.strip()) and text.count("<think>") == 1)
    return Reasoned("", re.sub(r"<think>.*", "", text, flags=re.DOTALL).strip(), False)
