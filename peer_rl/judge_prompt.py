"""The UnifiReward conversation layout (DESIGN 1.2): system + 4 x (user, assistant).

Rounds 1-3 judge one reasoning step each, round 4 compares two replies. The template is data:
it is written next to a trained reward model (`judge_template.json`) and read back at RL time,
so the judge always sees the wording it was trained on.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from peer_rl.reasoning import render_history

TEMPLATE_FILE = "judge_template.json"

STEP_VERDICTS = {"en": ("True", "False"), "zh": ("正确", "错误")}
PREFERENCE_VERDICTS = {
    "en": ("The first sentence is better", "The second sentence is better",
           "The two sentences are almost good", "Neither sentence is available"),
    "zh": ("第一句更好", "第二句更好", "差不多", "都不可用"),
}


def _default_text() -> dict:
    return {
        "en": {
            "system": "You are an expert judge of emotional support conversations. You check a "
                      "supporter's reasoning one step at a time, then compare two candidate replies.",
            "step": "{history_block}Step {k} of the supporter's reasoning ({name}):\n{step}\n"
                    "Is this step correct? Answer True or False.",
            "history_block": "Dialogue history:\n{history}\n\n",
            "step_names": ["conversation history analysis", "emotional state inference",
                           "strategy selection"],
            "preference": "Candidate replies to the seeker's last message:\nFirst: {first}\n"
                          "Second: {second}\nWhich reply is better? Answer with one of: "
                          "The first sentence is better / The second sentence is better / "
                          "The two sentences are almost good / Neither sentence is available.",
        },
        "zh": {
            "system": "你是情感支持对话的专业评审。你逐步检查支持者的推理，再比较两条候选回复。",
            "step": "{history_block}支持者推理的步骤{k}（{name}）：\n{step}\n这一步是否正确？请回答正确或错误。",
            "history_block": "对话历史：\n{history}\n\n",
            "step_names": ["对话历史分析", "情绪状态推断", "策略选择"],
            "preference": "对求助者最后一句话的候选回复：\n第一句：{first}\n第二句：{second}\n"
                          "哪条回复更好？请回答：第一句更好 / 第二句更好 / 差不多 / 都不可用。",
        },
    }


@dataclass
class JudgeTemplate:
    text: dict = field(default_factory=_default_text)
    version: int = 1

    def system(self, lang: str) -> dict:
        return {"role": "system", "content": self.text[lang]["system"]}

    def step_turn(self, k: int, step: str, history: list[dict], lang: str) -> dict:
        """User turn of round k (1-3); the history is given once, in round 1."""
        t = self.text[lang]
        block = t["history_block"].format(history=render_history(history, lang)) if k == 1 else ""
        content = t["step"].format(history_block=block, k=k, name=t["step_names"][k - 1], step=step)
        return {"role": "user", "content": content}

    def preference_turn(self, first: str, second: str, lang: str) -> dict:
        return {"role": "user",
                "content": self.text[lang]["preference"].format(first=first, second=second)}

    def conversation(self, history, steps, first, second, verdicts, lang) -> list[dict]:
        """The full 9-message chat with the given assistant verdicts (SER rows, SFT targets)."""
        msgs = [self.system(lang)]
        for k in (1, 2, 3):
            msgs += [self.step_turn(k, steps[k - 1], history, lang),
                     {"role": "assistant", "content": verdicts[k - 1]}]
        msgs += [self.preference_turn(first, second, lang),
                 {"role": "assistant", "content": verdicts[3]}]
        return msgs

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / TEMPLATE_FILE
        path.write_text(json.dumps(asdict(self), ensure_ascii=False, indent=2), encoding="utf-8")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> "JudgeTemplate":
        """The template saved with a reward model; the built-in one when the model has none."""
        path = Path(directory) / TEMPLATE_FILE
        if not path.exists():
            return cls()
        raw = json.loads(path.read_text(encoding="utf-8"))
        return cls(text=raw["text"], version=raw.get("version", 1))
