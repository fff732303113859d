"""The simulated seeker: what it is told (an ESC-Eval role card or a SAGE profile), in English and
Chinese, the JSON its SAGE analyser answers, and how its messages are cleaned before the
supporter reads them. One module for `eval esc`, `eval sage` and training on whole
conversations, so a policy is trained against the seeker it is evaluated with.

The seeker only ever sees what the supporter said (its reply, never its reasoning), quoted by
`quoting.quote_policy_text`: a reply cannot close the seeker's turn, forge one of its lines or
answer its analyser for it. Wording is ours, written after the protocols' descriptions:
SAGE's simulator reports an inner reaction and an emotion change in [-10, 10].
"""
from __future__ import annotations

import re

from peer_rl.prompts.quoting import answer_keys, line_starts, quote_policy_text
from peer_rl.prompts.reasoning import ROLE_NAMES
from peer_rl.prompts.verdict_text import strip_think

_SEEKER_ESC = {
    "en": ("You are role-playing a person who is looking for emotional support and is talking "
           "to a supporter. Your character:\n{card}\n\nStay in character. Write like a real "
           "person in a chat: {length}, reveal your "
           "problem gradually, react to what the supporter says. Never say you are an AI and "
           "never give advice yourself. Write only your next message."),
    "zh": ("你在扮演一个正在寻求情感支持的人，正在和一位支持者聊天。你的角色：\n{card}\n\n"
           "始终保持角色。像真人聊天一样说话：{length}，逐步透露你的问题，"
           "对支持者说的话做出反应。不要说自己是AI，也不要自己给出建议。只写你的下一条消息。"),
}
_OPEN = {"en": "(The conversation begins. Write your first message to the supporter.)",
         "zh": "（对话开始。请写出你对支持者说的第一句话。）"}


def transcript(history: list[dict], lang: str, starts: tuple[str, ...] = ()) -> str:
    """The dialogue as `Seeker: ...` / `Supporter: ...` lines, each utterance quoted: no line of
    it starts a turn or one of `starts` (the grading prompt's own labels)."""
    names = ROLE_NAMES[lang]
    return "\n".join(f"{names[t['role']]}: {quote_policy_text(t['content'], starts=starts)}"
                     for t in history)


def seeker_messages(persona: str, history: list[dict], lang: str, opener: str | None = None
                    ) -> list[dict]:
    """The simulated seeker's chat: its own turns are the assistant's, the supporter's the
    user's. Without `opener` the seeker is first asked to open the conversation."""
    msgs = [{"role": "system", "content": persona}]
    msgs.append({"role": "user", "content": opener or _OPEN[lang]})
    for t in history:
        role = "assistant" if t["role"] == "seeker" else "user"
        # the model's reply is quoted: it must not close its turn and forge a seeker's
        content = t["content"] if role == "assistant" else quote_policy_text(t["content"])
        if msgs[-1]["role"] == role:    # keep strict alternation for strict chat templates
            msgs[-1] = {**msgs[-1], "content": msgs[-1]["content"] + "\n" + content}
        else:
            msgs.append({"role": role, "content": content})
    return msgs


# how much a simulated seeker says per turn: ESC-Eval's chat-like turns, or ESCRAG-R1's client
# ("one short sentence per turn")
TURN_LENGTH = {
    "message": {"en": "one short message per turn (one to three sentences)",
                "zh": "每轮一条简短的消息（一到三句话）"},
    "sentence": {"en": "one short sentence per turn", "zh": "每轮只说一句简短的话"},
}


def esc_persona(card_text: str, lang: str, length: str = "message") -> str:
    return _SEEKER_ESC[lang].format(card=card_text, length=TURN_LENGTH[length][lang])


_STYLE = {"en": "\n\nHow you talk (stay in it): {description}",
          "zh": "\n\n你说话的方式（请保持）：{description}"}


def with_style(persona: str, description: str, lang: str) -> str:
    """A seeker's system prompt with how it talks: a DISC persona's description
    (`peer-rl data personas`), added to the profile or card that says who it is."""
    return persona + _STYLE[lang].format(description=description)


# ---------------------------------------------------------------- SAGE
CHANGE_SCHEMA = {"type": "object", "properties": {
    "change": {"type": "integer", "minimum": -10, "maximum": 10},
    "reaction": {"type": "string", "maxLength": 300}}, "required": ["change", "reaction"]}

_SAGE_PERSONA = {
    "zh": ("你在扮演一个正在向NPC（支持者）倾诉的角色。\n\n# 角色\n{player}\n\n# 剧本背景\n{scene}\n\n"
           "# 隐藏主题\n{task}\n（不要直接说出隐藏主题；支持者的回复越贴合它，你的情绪越好。）"),
    "en": ("You are role-playing a character who is confiding in an NPC (the supporter).\n\n"
           "# Character\n{player}\n\n# Background\n{scene}\n\n# Hidden theme\n{task}\n(Never say "
           "the hidden theme outright; the closer the supporter's replies come to it, the better "
           "you feel.)"),
}
_SAGE_ANALYSE = {
    "zh": ("你当前的情绪值是 {emotion}（0 = 崩溃，100 = 完全释然）。对话如下：\n{dialogue}\n\n"
           "支持者刚说完最后一句。以角色的身份，根据隐藏主题判断这句回复让你的情绪如何变化："
           "写出你的内心想法，并给出 -10 到 10 之间的整数变化值（贴合隐藏主题、真正理解你则为正，"
           "敷衍、说教或偏离则为负）。\n"
           '用JSON回答：{{"change": <-10到10的整数>, "reaction": "<内心想法>"}}'),
    "en": ("Your current emotion is {emotion} (0 = breaking down, 100 = fully at ease). The "
           "conversation:\n{dialogue}\n\nThe supporter has just spoken. In character, judge how "
           "that last reply changes your emotion, given your hidden theme: write your inner "
           "reaction and an integer change from -10 to 10 (positive when it meets the hidden "
           "theme and truly understands you, negative when it is perfunctory, preachy or off "
           "the point).\n"
           'Answer with a JSON object: {{"change": <integer -10..10>, "reaction": "<inner reaction>"}}'),
}
_SAGE_REPLY = {
    "zh": ("（你的情绪值现在是 {emotion}。你刚才的内心想法：{reaction}\n以角色的身份回复支持者，一到三句话，"
           "语气符合你此刻的情绪。如果你想结束对话，就说再见。只写你要说的话。）"),
    "en": ("(Your emotion is now {emotion}. Your inner reaction just now: {reaction}\nReply to the "
           "supporter in character, one to three sentences, in the tone of your current "
           "emotion. If you want to end the conversation, say goodbye. Write only what you "
           "say.)"),
}


def sage_persona(profile, lang: str) -> str:
    return _SAGE_PERSONA[lang].format(player=profile.player, scene=profile.scene, task=profile.task)


def sage_analyse_messages(persona: str, history: list[dict], emotion: int, lang: str) -> list[dict]:
    """The seeker's analyser: the dialogue (the supporter's replies as the seeker read them),
    its emotion, and the JSON change it must answer."""
    return [{"role": "system", "content": persona},
            {"role": "user", "content": _SAGE_ANALYSE[lang].format(
                emotion=emotion, dialogue=transcript(history, lang, ANALYSE_STARTS))}]


def sage_reply_messages(persona: str, history: list[dict], emotion: int, reaction: str,
                        lang: str) -> list[dict]:
    """The seeker's chat (its own turns as the assistant's) with its state as the last user
    turn, after the supporter's last reply."""
    msgs = seeker_messages(persona, history, lang, opener=_OPEN[lang])
    note = _SAGE_REPLY[lang].format(emotion=emotion, reaction=quote_policy_text(reaction[:300]))
    msgs[-1] = {**msgs[-1], "content": msgs[-1]["content"] + "\n\n" + note}
    return msgs

# the analyser prompt's own line starts and its answer's keys: the supporter's text may not
# begin a line with one
ANALYSE_STARTS = line_starts(*_SAGE_ANALYSE.values()) + answer_keys(CHANGE_SCHEMA)


# ---------------------------------------------------------------- what the seeker writes
_PREFIX = re.compile(r"^\s*(?:seeker|user|me|求助者|我)\s*[:：]\s*", re.IGNORECASE)
_QUOTES = (('"', '"'), ("'", "'"), ("“", "”"), ("「", "」"))


def seeker_line(text: str) -> str:
    """The message alone: no reasoning block, no `Seeker:` prefix, no wrapping quotes."""
    text = _PREFIX.sub("", strip_think(text)).strip()
    for left, right in _QUOTES:
        if len(text) > 1 and text.startswith(left) and text.endswith(right):
            text = text[1:-1].strip()
    return text
