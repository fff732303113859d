"""Structured empathetic reasoning: the policy instruction and the Step 1-4 parser.

Only Step 4 is ever shown to a seeker; Steps 1-3 exist so that UnifiReward can judge the
process. The parser is deliberately tolerant of marker spelling (full/half-width colons,
optional spaces, optional step titles) because sampled outputs drift, and strict about order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

STRATEGIES = (
    "Question",
    "Restatement or Paraphrasing",
    "Reflection of Feelings",
    "Self-disclosure",
    "Affirmation and Reassurance",
    "Providing Suggestions",
    "Information",
    "Others",
)
STAGES = ("exploration", "reassurance", "action")  # the PEER paper's support stages
SENTIMENTS = ("positive", "negative", "neutral")
INTENSITIES = ("mild", "moderate", "intense")

STEP_TITLES = {
    "en": ("Conversation History Analysis.", "Emotional State Inference.",
           "Strategy Selection.", "Response Generation."),
    "zh": ("对话历史分析。", "情绪状态推断。", "策略选择。", "回复生成。"),
}
ROLE_NAMES = {"en": {"seeker": "Seeker", "supporter": "Supporter"},
              "zh": {"seeker": "求助者", "supporter": "支持者"}}

# "Step 1:", "Step1：", "step 2 :", "步骤1：", "步骤 3:" ...
_MARKER = re.compile(r"(?:\bstep\s*([1-4])|步骤\s*([1-4]))\s*[:：]", re.IGNORECASE)
_TITLE = re.compile(
    r"^\s*(?:conversation\s+history\s+analysis|emotional\s+state\s+inference|strategy\s+selection"
    r"|response\s+generation|对话历史分析|情绪状态推断|策略选择|回复生成)\s*[.。:：]?\s*",
    re.IGNORECASE,
)


def step_marker(step: int, lang: str) -> str:
    """The canonical marker + title a well-formed output uses, e.g. `Step 4: Response Generation.`"""
    title = STEP_TITLES[lang][step - 1]
    return f"Step {step}: {title}" if lang == "en" else f"步骤{step}： {title}"


def format_structured(steps: list[str] | tuple[str, ...], lang: str) -> str:
    """Render four step bodies in the canonical layout (used by SFT targets and tests)."""
    if len(steps) != 4:
        raise ValueError(f"expected 4 step texts, got {len(steps)}")
    return "\n".join(f"{step_marker(i + 1, lang)}\n{body.strip()}" for i, body in enumerate(steps))


@dataclass(frozen=True)
class ParsedOutput:
    steps: dict[int, str] = field(default_factory=dict)  # step number -> body (title stripped)
    in_order: bool = False

    @property
    def complete(self) -> bool:
        """All four steps present exactly once, in order, each with non-empty content."""
        return self.in_order and all(self.steps.get(k, "").strip() for k in (1, 2, 3, 4))

    def reply(self, raw: str) -> str:
        """What the seeker would see: Step 4, or the raw text when Step 4 is missing."""
        return self.steps.get(4, "").strip() or raw.strip()


def parse_structured(text: str) -> ParsedOutput:
    matches = list(_MARKER.finditer(text))
    numbers = [int(m.group(1) or m.group(2)) for m in matches]
    steps: dict[int, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = _TITLE.sub("", text[m.end():end], count=1).strip()
        steps.setdefault(numbers[i], body)
    return ParsedOutput(steps=steps, in_order=numbers == [1, 2, 3, 4])


def format_complete(text: str) -> bool:
    return parse_structured(text).complete


def join_turns(history: list[dict], roles: dict[str, str], separator: str = "\n",
               clean=lambda text: text) -> str:
    """Utterances as `<role prefix><text>`, joined: the one history layout every prompt and
    template renders (an unknown role is written `<role>: `; `clean` treats the text)."""
    return separator.join(roles.get(t["role"], f"{t['role']}: ") + clean(t["content"])
                          for t in history)


def render_history(history: list[dict], lang: str) -> str:
    return join_turns(history, {role: f"{name}: " for role, name in ROLE_NAMES[lang].items()})


_SYSTEM = {
    "en": "You are an emotional support companion. Think through the conversation step by step "
          "before you reply, and reply warmly, specifically and briefly.",
    "zh": "你是一位情感支持陪伴者。回复前请逐步思考对话，回复要温暖、具体、简洁。",
}
_INSTRUCTION = {
    "en": ("Here is the conversation so far:\n{history}\n{visual}"
           "Write your reasoning and reply in exactly four steps:\n"
           "Step 1: Conversation History Analysis. The seeker's core issue and the current support "
           "stage (exploration, reassurance or action).\n"
           "Step 2: Emotional State Inference. Sentiment (positive, negative or neutral), intensity "
           "(mild, moderate or intense) and the specific emotions{visual_hint}.\n"
           "Step 3: Strategy Selection. One of: {strategies}, and why.\n"
           "Step 4: Response Generation. The reply the seeker will read."),
    "zh": ("以下是目前的对话：\n{history}\n{visual}"
           "请严格按四个步骤写出推理和回复：\n"
           "步骤1： 对话历史分析。求助者的核心问题和当前的支持阶段（探索、安慰或行动）。\n"
           "步骤2： 情绪状态推断。情感倾向（积极、消极或中性）、强度（轻度、中度或强烈）和具体情绪{visual_hint}。\n"
           "步骤3： 策略选择。从以下策略中选一个：{strategies}，并说明原因。\n"
           "步骤4： 回复生成。求助者将看到的回复。"),
}
_VISUAL = {
    "en": ("The seeker's facial expression is shown in the attached frames.\n",
           ", using both the words and the facial expression"),
    "zh": ("附图为求助者的面部表情画面。\n", "，结合文字和面部表情"),
}


def policy_messages(history: list[dict], lang: str, visual: bool = False) -> list[dict]:
    """The chat the policy answers: system prompt + one user turn with history and instruction."""
    if lang not in _SYSTEM:
        raise ValueError(f"unsupported language {lang!r}; expected one of {sorted(_SYSTEM)}")
    visual_line, visual_hint = _VISUAL[lang] if visual else ("", "")
    sep = ", " if lang == "en" else "、"
    user = _INSTRUCTION[lang].format(history=render_history(history, lang), visual=visual_line,
                                     visual_hint=visual_hint, strategies=sep.join(STRATEGIES))
    return [{"role": "system", "content": _SYSTEM[lang]}, {"role": "user", "content": user}]
