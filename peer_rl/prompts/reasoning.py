"""Structured empathetic reasoning: the policy instruction and the one reading of its output.

Only Step 4 is ever shown to a seeker; Steps 1-3 exist so that UnifiReward can judge the
process. `parse_structured` is the one reading of a policy's output that training (the judge,
RUR, the format reward), the verl plug-in and every evaluation (what the seeker and the judges
see) use:

| the output                                  | read as                                          |
|---------------------------------------------|--------------------------------------------------|
| a `<think>` block                           | nothing                                          |
| a step label: `Step 4`, `step4`, `Step four`, `步骤4`, `步骤四`, `第4步`, `第四步` | where a step begins |
| ... at a line's start, after Markdown (`#`, `>`, `-`, `**`, `__`) and followed by `:` `：` `-` `—` `.` `、`, the end of the line or the step's title | a label (`**Step 4:**`, `### Step 4`, `Step 4 - Response Generation:`, `**第四步 回复生成**`) |
| ... inside a line, followed by `:` or `：`   | a label (`... Step 2: y Step 3: z`)             |
| the step's title after its label (`Response Generation.`, `回复生成。`), closing emphasis | not part of the step |
| everything after the first Step 4 label     | the reply, labels and all (`Step 1: breathe.` in a reply is advice, not a new step) |
| no Step 4 label                             | the reply is the body of the last step labelled, or the whole output when none is |

The format is complete when Steps 1, 2, 3 and 4 are labelled once each, in that order, before the
reply begins, each with a non-empty body.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from peer_rl.prompts.verdict_text import strip_think

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

_NUMBERS = {"1": 1, "2": 2, "3": 3, "4": 4, "one": 1, "two": 2, "three": 3, "four": 4,
            "一": 1, "二": 2, "三": 3, "四": 4}
_LABEL = (r"(?:\bstep\s*(?P<en>[1-4](?![0-9])|(?:one|two|three|four)\b)"
          r"|步骤\s*(?P<zh>[1-4](?![0-9])|[一二三四])|第\s*(?P<di>[1-4]|[一二三四])\s*步)")
_TITLES = (r"conversation\s+history\s+analysis|emotional\s+state\s+inference|strategy\s+selection"
           r"|response\s+generation|对话历史分析|情绪状态推断|策略选择|回复生成")
# what may follow a label: closing emphasis, then the step's title (in brackets or emphasis),
# its punctuation and closing emphasis again
_AFTER = (rf"[ \t]*[*_]{{0,3}}(?:\s*[*_]{{0,3}}[(（]?(?:{_TITLES})[)）]?[*_]{{0,3}}[ \t]*"
          r"(?:[.。:：、\-—–](?![0-9]))?[ \t]*[*_]{0,3})?")
_SEPARATOR = r"(?:[:：、\-—–]|\.(?![0-9]))"
_MARKER = re.compile(
    rf"(?P<line>^[ \t]*(?:>[ \t]*)*(?:#{{1,6}}[ \t]*)?(?:[-+•*][ \t]+)?)?[*_]{{0,3}}{_LABEL}"
    rf"[*_]{{0,3}}[ \t]*"
    # at a line's start (after Markdown): any separator, or none before the line's end or a
    # title; inside a line: a colon
    rf"(?(line)(?:{_SEPARATOR}|(?=[ \t]*(?:\n|$))|(?=[(（]?(?:{_TITLES})))|[:：]){_AFTER}",
    re.IGNORECASE | re.MULTILINE)


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
    in_order: bool = False          # Steps 1-4 labelled once each, in order, before the reply
    reply: str = ""                 # what the seeker, the judge and RUR see (module table)

    @property
    def complete(self) -> bool:
        """All four steps present exactly once, in order, each with non-empty content."""
        return self.in_order and all(self.steps.get(k, "").strip() for k in (1, 2, 3, 4))

    @property
    def has_step4(self) -> bool:
        """A Step 4 label with a non-empty reply after it (the evaluations' format count)."""
        return bool(self.steps.get(4))


def _number(m: re.Match) -> int:
    return _NUMBERS[(m.group("en") or m.group("zh") or m.group("di")).lower()]


def parse_structured(text: str) -> ParsedOutput:
    """The one reading of a policy's output (the module's table)."""
    text = strip_think(text)
    steps: dict[int, str] = {}
    numbers: list[int] = []
    marks = list(_MARKER.finditer(text))
    for i, m in enumerate(marks):
        numbers.append(_number(m))
        if numbers[-1] == 4:                    # the reply runs to the end, labels and all
            steps[4] = text[m.end():].strip()
            return ParsedOutput(steps, numbers == [1, 2, 3, 4], steps[4])
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        steps.setdefault(numbers[-1], text[m.end():end].strip())
    reply = text[marks[-1].end():].strip() if marks else text
    return ParsedOutput(steps, False, reply)


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
