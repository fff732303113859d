"""The UnifiReward conversation layout: system + 4 x (user, assistant).

Rounds 1-3 judge one reasoning step each and, as the PEER data card lays a SER row out, each of
their user turns gives the dialogue history plus that step; round 4 compares two replies. The
template is data: it is written next to a trained reward model (`judge_template.json`) and read
back at RL time, so the judge always sees the wording it was trained on. It can also be read
backwards (`match`): a SER row the template cannot reproduce exactly is a row whose wording the
RL-time judge would never see, which `peer-rl train-rm` refuses to train on unknowingly.

A language's entry:
    system      the system message (literal)
    steps       three user-turn formats, fields {history} (optional) and {step}
    preference  the round-4 user turn, fields {first} and {second}
    roles       {"seeker": prefix, "supporter": prefix} before each history utterance
    turn_separator   between history utterances
    outcome     (optional) the user turn of a separate outcome model (PRM + ORM), fields
                {history}, {first}, {second}; by default the round-1 text before the history,
                the history, a blank line and the round-4 turn

`role` says which judgement a model trained with the template gives: `unified` (UnifiReward:
rounds 1-4 in one chat), `process` (a PRM: rounds 1-3) or `outcome` (an ORM: one turn with
the history and the two replies), so a reward pool can refuse a model in the wrong slot.
"""
from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from peer_rl.prompts.multimodal import strip_tags
from peer_rl.prompts.quoting import line_starts, quote_policy_text
from peer_rl.prompts.reasoning import join_turns

TEMPLATE_FILE = "judge_template.json"
VERSION = 2

STEP_VERDICTS = {"en": ("True", "False"), "zh": ("正确", "错误")}
PREFERENCE_VERDICTS = {
    "en": ("The first sentence is better", "The second sentence is better",
           "The two sentences are almost good", "Neither sentence is available"),
    "zh": ("第一句更好", "第二句更好", "差不多", "都不可用"),
}
STEP_FIELDS, PREFERENCE_FIELDS = ("history", "step"), ("first", "second")
ROLES = ("unified", "process", "outcome")


def _default_text() -> dict:
    en_names = ("conversation history analysis", "emotional state inference",
                "strategy selection")
    zh_names = ("对话历史分析", "情绪状态推断", "策略选择")
    return {
        "en": {
            "system": "You are an expert judge of emotional support conversations. You check a "
                      "supporter's reasoning one step at a time, then compare two candidate replies.",
            "steps": [f"Dialogue history:\n{{history}}\n\nStep {k} of the supporter's reasoning "
                      f"({name}):\n{{step}}\nIs this step correct? Answer True or False."
                      for k, name in enumerate(en_names, start=1)],
            "preference": "Candidate replies to the seeker's last message:\nFirst: {first}\n"
                          "Second: {second}\nWhich reply is better? Answer with one of: "
                          "The first sentence is better / The second sentence is better / "
                          "The two sentences are almost good / Neither sentence is available.",
            "roles": {"seeker": "Seeker: ", "supporter": "Supporter: "},
            "turn_separator": "\n",
        },
        "zh": {
            "system": "你是情感支持对话的专业评审。你逐步检查支持者的推理，再比较两条候选回复。",
            "steps": [f"对话历史：\n{{history}}\n\n支持者推理的步骤{k}（{name}）：\n{{step}}\n"
                      "这一步是否正确？请回答正确或错误。"
                      for k, name in enumerate(zh_names, start=1)],
            "preference": "对求助者最后一句话的候选回复：\n第一句：{first}\n第二句：{second}\n"
                          "哪条回复更好？请回答：第一句更好 / 第二句更好 / 差不多 / 都不可用。",
            "roles": {"seeker": "求助者: ", "supporter": "支持者: "},
            "turn_separator": "\n",
        },
    }


def _from_v1(text: dict) -> dict:
    """A version-1 template (one `step` format, history once in round 1) in today's layout."""
    out = {}
    for lang, t in text.items():
        steps = [t["step"].replace("{history_block}", t["history_block"] if k == 1 else "")
                 .replace("{k}", str(k)).replace("{name}", name)
                 for k, name in enumerate(t["step_names"], start=1)]
        seeker, supporter = {"zh": ("求助者", "支持者")}.get(lang, ("Seeker", "Supporter"))
        out[lang] = {"system": t["system"], "steps": steps, "preference": t["preference"],
                     "roles": {"seeker": f"{seeker}: ", "supporter": f"{supporter}: "},
                     "turn_separator": "\n"}
    return out


class TemplateError(ValueError):
    """A template file that is not a usable judge template (names the file and the key)."""


def _fields(fmt: str, where: str = "") -> list[str]:
    try:
        return [f for _, f, _, _ in string.Formatter().parse(fmt) if f is not None]
    except ValueError as exc:            # a lone brace
        raise TemplateError(f"{where}: not a format string ({exc}; a literal brace is "
                            "written {{ or }})") from None


def validate_text(text: dict, where: str = "judge template") -> None:
    """Every language has every key, each a text (a string) and each format exactly the fields
    it may hold."""
    if not isinstance(text, dict) or not text:
        raise TemplateError(f"{where}: expected an object of languages (en, zh, ...)")
    for lang, t in text.items():
        if not isinstance(t, dict):
            raise TemplateError(f"{where}: {lang}: expected an object of system, steps, "
                                f"preference, roles, turn_separator; found {t!r}")
        for key in ("system", "steps", "preference", "roles", "turn_separator"):
            if key not in t:
                raise TemplateError(f"{where}: {lang}.{key}: missing")
        texts = {"system": t["system"], "preference": t["preference"],
                 "turn_separator": t["turn_separator"], "outcome": t.get("outcome", "")}
        if isinstance(t["steps"], list):
            texts |= {f"steps[{k}]": fmt for k, fmt in enumerate(t["steps"])}
        if isinstance(t["roles"], dict):
            texts |= {f"roles.{role}": prefix for role, prefix in t["roles"].items()}
        for key, value in texts.items():
            if not isinstance(value, str):
                raise TemplateError(f"{where}: {lang}.{key}: expected a string, found {value!r}")
        if not isinstance(t["steps"], list) or len(t["steps"]) != 3:
            raise TemplateError(f"{where}: {lang}.steps: expected 3 formats (rounds 1-3)")
        for k, fmt in enumerate(t["steps"], start=1):
            got = _fields(fmt, f"{where}: {lang}.steps[{k - 1}]")
            if got.count("step") != 1 or got.count("history") > 1 or set(got) - set(STEP_FIELDS):
                raise TemplateError(f"{where}: {lang}.steps[{k - 1}]: expected {{step}} once and "
                                    f"{{history}} at most once, found fields {got}")
        got = _fields(t["preference"], f"{where}: {lang}.preference")
        if sorted(got) != sorted(PREFERENCE_FIELDS):
            raise TemplateError(f"{where}: {lang}.preference: expected {{first}} and {{second}} "
                                f"once each, found fields {got}")
        if not t["turn_separator"]:
            raise TemplateError(f"{where}: {lang}.turn_separator: expected a non-empty string")
        if not isinstance(t["roles"], dict) or set(t["roles"]) != {"seeker", "supporter"}:
            raise TemplateError(f"{where}: {lang}.roles: expected seeker and supporter prefixes, "
                                f"found {t['roles']!r}")


def _pattern(fmt: str) -> re.Pattern:
    """A format string as a full-match regex, one lazy named group per field."""
    parts = []
    for literal, name, _, _ in string.Formatter().parse(fmt):
        parts.append(re.escape(literal))
        if name is not None:
            parts.append(f"(?P<{name}>.*?)")
    return re.compile("".join(parts), re.DOTALL)


@dataclass(frozen=True)
class SerParts:
    """What a SER chat says, read back through a template."""
    history: list[dict]
    steps: tuple[str, str, str]
    first: str
    second: str
    verdicts: tuple[str, str, str, str]


class RowMismatch(ValueError):
    """A SER chat the template cannot reproduce; the message says where it first differs."""


@dataclass
class JudgeTemplate:
    text: dict = field(default_factory=_default_text)
    version: int = VERSION
    role: str = "unified"
    # special token strings of the judge's tokenizer, broken in policy text (not saved)
    specials: tuple = field(default=(), compare=False, repr=False)

    def _safe(self, text: str, lang: str) -> str:
        return quote_policy_text(text, self.specials, *self.labels(lang))

    def labels(self, lang: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """What policy text must not reproduce beyond quoting's own rules: the template's line
        starts (its fixed lines and field labels, the role prefixes), and its verdicts as lines
        of their own."""
        t = self.text[lang]
        starts = line_starts(*t["steps"], t["preference"], t.get("outcome", ""),
                             *(p.strip() for p in t["roles"].values()))
        verdicts = STEP_VERDICTS.get(lang, ()) + PREFERENCE_VERDICTS.get(lang, ())
        return starts, tuple(verdicts)

    def language(self, lang: str) -> str:
        """The template language for a row's language; one the template lacks is an error, not
        a silent switch to English (rows are normalised to en/zh at load)."""
        if lang not in self.text:
            raise ValueError(f"judge language {lang!r}: the judge template has "
                             f"{sorted(self.text)}")
        return lang

    # ------------------------------------------------------------------------- rendering
    def history_text(self, history: list[dict], lang: str) -> str:
        t = self.text[lang]
        return join_turns(history, t["roles"], t["turn_separator"],
                          lambda text: self._safe(text, lang))

    def system(self, lang: str) -> dict:
        return {"role": "system", "content": self.text[lang]["system"]}

    def step_turn(self, k: int, step: str, history: list[dict], lang: str) -> dict:
        """User turn of round k (1-3): the history (where the format shows it) and step k."""
        return {"role": "user", "content": self.text[lang]["steps"][k - 1].format(
            history=self.history_text(history, lang), step=self._safe(step, lang))}

    def preference_turn(self, first: str, second: str, lang: str) -> dict:
        return {"role": "user", "content": self.text[lang]["preference"].format(
            first=self._safe(first, lang), second=self._safe(second, lang))}

    def outcome_format(self, lang: str) -> str:
        t = self.text[lang]
        if "outcome" in t:
            return t["outcome"]
        head = t["steps"][0].partition("{history}")[0] if "{history}" in t["steps"][0] else ""
        return head + "{history}\n\n" + t["preference"]

    def outcome_turn(self, first: str, second: str, history: list[dict], lang: str) -> dict:
        """The one user turn of a separate outcome model: the history and the two replies."""
        return {"role": "user", "content": self.outcome_format(lang).format(
            history=self.history_text(history, lang), first=self._safe(first, lang),
            second=self._safe(second, lang))}

    def outcome_chat(self, parts: "SerParts", lang: str) -> list[dict]:
        """A SER row as an ORM's training chat: system, the outcome turn, the preference."""
        return [self.system(lang), self.outcome_turn(parts.first, parts.second, parts.history,
                                                     lang),
                {"role": "assistant", "content": parts.verdicts[3]}]

    def item_turns(self, item, history: list[dict]) -> list[dict | None]:
        """The 4 user turns judging a JudgeItem (None where a step is missing: not asked). With
        no step asked the preference turn carries the history itself (the outcome layout), so
        the judge never compares replies to a dialogue it was not shown. An item without a
        reference reply (a simulated dialogue's turn) is not asked the preference."""
        lang = self.language(item.lang)
        turns: list[dict | None] = [
            None if step is None else self.step_turn(k, step, history, lang)
            for k, step in enumerate((list(item.steps) + [None] * 3)[:3], start=1)]
        if item.reference is None:
            return turns + [None]
        first, second = ((item.reply, item.reference) if item.candidate_first
                         else (item.reference, item.reply))
        turns.append(self.preference_turn(first, second, lang) if any(turns)
                     else self.outcome_turn(first, second, history, lang))
        return turns

    def conversation(self, history, steps, first, second, verdicts, lang) -> list[dict]:
        """The full 9-message chat with the given assistant verdicts (SER rows, SFT targets)."""
        msgs = [self.system(lang)]
        for k in (1, 2, 3):
            msgs += [self.step_turn(k, steps[k - 1], history, lang),
                     {"role": "assistant", "content": verdicts[k - 1]}]
        msgs += [self.preference_turn(first, second, lang),
                 {"role": "assistant", "content": verdicts[3]}]
        return msgs

    # ------------------------------------------------------------------------- reading back
    def parse_history(self, text: str, lang: str) -> list[dict]:
        """A rendered history back into turns (each utterance starts with a role prefix)."""
        t = self.text[lang]
        if not text:
            return []
        prefixes = {p: role for role, p in t["roles"].items()}
        alt = "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True))
        sep = re.escape(t["turn_separator"])
        starts = [m for m in re.finditer(rf"(?:^|(?<={sep}))(?:{alt})", text)]
        if not starts or starts[0].start() != 0:
            raise RowMismatch(f"the history does not start with a role prefix "
                              f"{sorted(prefixes)}: {text[:60]!r}")
        turns = []
        for i, m in enumerate(starts):
            end = (starts[i + 1].start() - len(t["turn_separator"]) if i + 1 < len(starts)
                   else len(text))
            turns.append({"role": prefixes[m.group(0)], "content": text[m.end():end]})
        return turns

    def match(self, messages: list[dict], lang: str) -> SerParts:
        """Read a 9-message SER chat back through this template; RowMismatch when the template
        would not reproduce it exactly (the first difference is named)."""
        if lang not in self.text:
            raise RowMismatch(f"language {lang!r}: the template has {sorted(self.text)}")
        t = self.text[lang]
        if len(messages) != 9:
            raise RowMismatch(f"expected 9 messages, found {len(messages)}")
        roles = [m.get("role") for m in messages]
        if roles != ["system"] + ["user", "assistant"] * 4:
            raise RowMismatch(f"expected roles system, (user, assistant) x 4; found {roles}")
        if messages[0]["content"] != t["system"]:
            raise RowMismatch("system message differs: " + _first_difference(
                t["system"], messages[0]["content"]))
        steps, histories = [], []
        for k in (1, 2, 3):
            content = messages[2 * k - 1]["content"]
            m = _pattern(t["steps"][k - 1]).fullmatch(content)
            if m is None:
                raise RowMismatch(f"round {k} user turn does not follow steps[{k - 1}]: "
                                  + _literal_difference(t["steps"][k - 1], content))
            steps.append(m.group("step"))
            if "history" in m.groupdict():
                histories.append(m.group("history"))
        if len(set(histories)) > 1:
            raise RowMismatch(f"the history differs between rounds 1-3 "
                              f"({len(set(histories))} versions)")
        m = _pattern(t["preference"]).fullmatch(messages[7]["content"])
        if m is None:
            raise RowMismatch("round 4 user turn does not follow preference: "
                              + _literal_difference(t["preference"], messages[7]["content"]))
        history = self.parse_history(histories[0], lang) if histories else []
        parts = SerParts(history=history, steps=tuple(steps), first=m.group("first"),
                         second=m.group("second"),
                         verdicts=tuple(messages[i]["content"] for i in (2, 4, 6, 8)))
        again = self.conversation(parts.history, parts.steps, parts.first, parts.second,
                                  parts.verdicts, lang)
        for i, (a, b) in enumerate(zip(again, messages)):
            if a["content"] != b["content"]:
                raise RowMismatch(f"message {i} does not render back identically: "
                                  + _first_difference(a["content"], b["content"]))
        return parts

    # ------------------------------------------------------------------------- files
    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / TEMPLATE_FILE
        path.write_text(self.dumps(), encoding="utf-8")
        return path

    def dumps(self) -> str:
        return json.dumps({"text": self.text, "version": self.version, "role": self.role},
                          ensure_ascii=False, indent=2)

    def with_role(self, role: str) -> "JudgeTemplate":
        if role not in ROLES:
            raise ValueError(f"judge role {role!r}: expected one of {ROLES}")
        return JudgeTemplate(text=self.text, version=self.version, role=role,
                             specials=self.specials)

    @classmethod
    def from_file(cls, path: str | Path) -> "JudgeTemplate":
        """A template file (a `judge_template.json`, e.g. from `peer-rl judge-template fit`)."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise TemplateError(f"{path}: not a readable JSON judge template ({exc})") from exc
        if not isinstance(raw, dict) or "text" not in raw:
            raise TemplateError(f"{path}: expected an object with 'text' (and 'version')")
        version = raw.get("version", 1)
        try:
            text = _from_v1(raw["text"]) if version == 1 else raw["text"]
        except (KeyError, TypeError, AttributeError) as exc:
            raise TemplateError(
                f"{path}: read as a version-1 template ('version' is "
                f"{'missing' if 'version' not in raw else version}), but its text lacks "
                f"{exc!s}; a current template says \"version\": {VERSION} (`peer-rl "
                "judge-template fit` writes one)") from None
        validate_text(text, str(path))
        role = raw.get("role", "unified")
        if role not in ROLES:
            raise TemplateError(f"{path}: role: expected one of {ROLES}, found {role!r}")
        return cls(text=text, version=VERSION, role=role)

    @classmethod
    def load(cls, directory: str | Path) -> "JudgeTemplate":
        """The template saved with a reward model; the built-in one when the model has none."""
        path = Path(directory) / TEMPLATE_FILE
        return cls.from_file(path) if path.exists() else cls()


def _first_difference(expected: str, found: str) -> str:
    i = next((i for i, (a, b) in enumerate(zip(expected, found)) if a != b),
             min(len(expected), len(found)))
    return (f"at character {i}, expected {expected[max(0, i - 20):i + 30]!r}, "
            f"found {found[max(0, i - 20):i + 30]!r}")


def _literal_difference(fmt: str, found: str) -> str:
    """Which fixed text of the format the turn lacks (the first one not found in order)."""
    pos = 0
    for literal, _, _, _ in string.Formatter().parse(fmt):
        if not literal:
            continue
        at = found.find(literal, pos)
        if at < 0:
            return f"fixed text {literal[:60]!r} not found"
        pos = at + len(literal)
    return "the fixed text is there but not in this layout"


@dataclass
class TemplateCheck:
    """Rows read back through a template: how many, and the first that did not match."""
    checked: int = 0
    mismatched: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, where: str, error: RowMismatch | None, keep: int = 5) -> None:
        self.checked += 1
        if error is not None:
            self.mismatched += 1
            if len(self.examples) < keep:
                self.examples.append(f"{where}: {error}")

    def summary(self) -> str:
        head = f"{self.mismatched}/{self.checked} SER row(s) differ from the judge template"
        return head + ("; first:\n  " + "\n  ".join(self.examples) if self.examples else "")


def check_rows(template: JudgeTemplate, rows: Iterable[tuple[str, dict]],
               keep: int = 5) -> TemplateCheck:
    """(where, row) pairs -> TemplateCheck; a row's `<image>` tags are not part of the wording."""
    report = TemplateCheck()
    for where, row in rows:
        try:
            template.match(strip_tags(row["messages"]), row.get("lang", "en"))
            report.add(where, None)
        except RowMismatch as exc:
            report.add(where, exc, keep)
    return report
