"""The policy's instruction as data: what it was trained on travels with its weights.

GRPO trains on each row's own `messages`; an evaluation or `peer-rl chat` has only a dialogue
and must build the prompt itself. If it built it with other words than the training rows, the
benchmark would measure the policy off the distribution it learned. So the instruction is a
template (`policy_template.json`) saved with the policy: `peer-rl sft` and `peer-rl train` read
it off their training rows and write it beside the model they export, and the evaluations load
it from the model directory (or `model.template`).

A language's entry:
    system          the system message
    textual         the user turn of a text row, field {history}
    visual          the user turn of a row with face frames, field {history}
    roles           {"seeker": prefix, "supporter": prefix} before each history utterance
    turn_separator  between history utterances
"""
from __future__ import annotations

import json
import os
import string
from dataclasses import dataclass, field
from pathlib import Path

from peer_rl.prompts.multimodal import strip_tags
from peer_rl.prompts.reasoning import join_turns, policy_messages

TEMPLATE_FILE = "policy_template.json"
VERSION = 1
MODALITIES = ("textual", "visual")
_SENTINEL = "\x00HISTORY\x00"


class PolicyTemplateError(ValueError):
    pass


def _builtin_text() -> dict:
    """peer_rl.prompts.reasoning.policy_messages with the history left as a field."""
    out = {}
    for lang in ("en", "zh"):
        entry = {}
        for modality in MODALITIES:
            sys_msg, user = policy_messages([{"role": "seeker", "content": _SENTINEL}], lang,
                                            visual=modality == "visual")
            entry["system"] = sys_msg["content"]
            prefix = "Seeker: " if lang == "en" else "求助者: "
            entry[modality] = (user["content"].replace("{", "{{").replace("}", "}}")
                               .replace(prefix + _SENTINEL, "{history}"))
        entry["roles"] = ({"seeker": "Seeker: ", "supporter": "Supporter: "} if lang == "en"
                          else {"seeker": "求助者: ", "supporter": "支持者: "})
        entry["turn_separator"] = "\n"
        out[lang] = entry
    return out


def _fields(fmt: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(fmt) if f is not None]


@dataclass
class PolicyTemplate:
    text: dict = field(default_factory=_builtin_text)
    version: int = VERSION
    source: str = field(default="built-in", compare=False)   # where it was read from

    def validate(self, where: str) -> None:
        for lang, t in self.text.items():
            for key in ("system", *MODALITIES, "roles", "turn_separator"):
                if key not in t:
                    raise PolicyTemplateError(f"{where}: {lang}.{key}: missing")
            for m in MODALITIES:
                if _fields(t[m]) != ["history"]:
                    raise PolicyTemplateError(f"{where}: {lang}.{m}: expected the one field "
                                              f"{{history}}, found {_fields(t[m])}")

    def history_text(self, history: list[dict], lang: str) -> str:
        t = self.text[lang]
        return join_turns(history, t["roles"], t["turn_separator"])

    def messages(self, history: list[dict], lang: str, visual: bool = False) -> list[dict]:
        """The chat the policy answers: its system message and one user turn."""
        if lang not in self.text:
            raise ValueError(f"policy prompt language {lang!r}: the template ({self.source}) "
                             f"has {sorted(self.text)}")
        t = self.text[lang]
        user = t["visual" if visual else "textual"].format(history=self.history_text(history,
                                                                                     lang))
        return [{"role": "system", "content": t["system"]}, {"role": "user", "content": user}]

    def matches(self, messages: list[dict], history: list[dict], lang: str,
                visual: bool) -> bool:
        """Whether a training row's prompt is exactly what this template builds for it."""
        if lang not in self.text:
            return False
        prompt = [m for m in messages if m["role"] != "assistant"]
        return _strip_tags(prompt) == self.messages(history, lang, visual)

    def reads(self, messages: list[dict], lang: str, visual: bool) -> bool:
        """Whether a prompt without a `history` field (an SFT row) is one this template builds:
        its user turn read back into utterances and rendered again, identical."""
        if lang not in self.text:
            return False
        prompt = _strip_tags([m for m in messages if m["role"] != "assistant"])
        t = self.text[lang]
        if len(prompt) != 2 or prompt[0]["content"] != t["system"]:
            return False
        fmt = t["visual" if visual else "textual"]
        head, _, tail = fmt.partition("{history}")
        head, tail = (x.replace("{{", "{").replace("}}", "}") for x in (head, tail))
        user = prompt[1]["content"]
        if not (user.startswith(head) and user.endswith(tail)) or len(user) < len(head + tail):
            return False
        body = user[len(head):len(user) - len(tail)]
        return body.startswith(tuple(t["roles"].values()))

    def dumps(self) -> str:
        return json.dumps({"text": self.text, "version": self.version}, ensure_ascii=False,
                          indent=2)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / TEMPLATE_FILE
        path.write_text(self.dumps(), encoding="utf-8")
        return path

    @classmethod
    def from_file(cls, path: str | Path) -> "PolicyTemplate":
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            t = cls(text=raw["text"], version=raw.get("version", VERSION), source=str(path))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise PolicyTemplateError(f"{path}: not a readable policy template ({exc})") from exc
        t.validate(str(path))
        return t

    @classmethod
    def load(cls, location: str | Path | None) -> "PolicyTemplate":
        """From a template file, or the one saved in a model directory; the built-in one when
        the location is empty or a model directory has none."""
        if not location:
            return cls()
        p = Path(location)
        if p.is_dir():
            return cls.from_file(p / TEMPLATE_FILE) if (p / TEMPLATE_FILE).exists() else cls()
        if p.is_file():
            return cls.from_file(p)
        return cls()          # an endpoint URL or a model name: nothing saved to read


def _strip_tags(messages: list[dict]) -> list[dict]:
    return [{"role": m["role"], "content": m["content"]} for m in strip_tags(messages)]


def _between(text: str, history: list[dict]) -> tuple[str, list[str], str] | None:
    """(text before the first utterance, the text between consecutive utterances, text after
    the last) when every utterance's content is found in order; None otherwise."""
    pos, gaps, starts = 0, [], []
    for turn in history:
        at = text.find(turn["content"], pos)
        if at < 0:
            return None
        starts.append(at)
        gaps.append(text[pos:at])
        pos = at + len(turn["content"])
    return gaps[0], gaps[1:], text[pos:]


def fit_policy_template(rows: list[dict]) -> tuple[PolicyTemplate, dict]:
    """A template read off training rows that carry both `history` and `messages` (GRPO rows):
    per language and modality, the fixed text around the history is what every row shares, and
    the role prefixes are what precedes each utterance. Returns (template, report with the
    number of rows it reproduces); languages or modalities absent from the rows keep the
    built-in wording."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if r.get("history") and len(r.get("messages") or ()) >= 2:
            kind = "visual" if r.get("modality") == "visual" else "textual"
            groups.setdefault((r["language"], kind), []).append(r)
    text = _builtin_text()
    for (lang, modality), part in sorted(groups.items()):
        entry = text.setdefault(lang, dict(text["en"]))
        prefix_of: dict[str, set] = {"seeker": set(), "supporter": set()}
        befores, afters = [], []
        for r in part:
            prompt = _strip_tags([m for m in r["messages"] if m["role"] != "assistant"])
            split = _between(prompt[-1]["content"], r["history"])
            if split is None:
                continue
            before, gaps, after = split
            befores.append((before, r["history"][0]["role"]))
            afters.append(after)
            for gap, turn in zip(gaps, r["history"][1:]):
                prefix_of[turn["role"]].add(gap)
            if prompt[0]["role"] == "system":
                entry["system"] = prompt[0]["content"]
        if not befores:
            continue
        # a gap is separator + the next utterance's role prefix: the separator is the common
        # start of all gaps, each role's prefix the rest
        all_gaps = prefix_of["seeker"] | prefix_of["supporter"]
        sep = os.path.commonprefix(sorted(all_gaps)) if len(all_gaps) > 1 \
            else entry["turn_separator"]
        sep = sep[:sep.rindex("\n") + 1] if "\n" in sep else sep
        roles = dict(entry["roles"])
        for role, gaps in prefix_of.items():
            if len(gaps) == 1:
                roles[role] = next(iter(gaps))[len(sep):]
        head = {b[:len(b) - len(roles.get(role0, ""))] if b.endswith(roles.get(role0, ""))
                else None for b, role0 in befores}
        tail = set(afters)
        if len(head) == 1 and None not in head and len(tail) == 1:
            entry[modality] = (next(iter(head)).replace("{", "{{").replace("}", "}}")
                               + "{history}" + next(iter(tail)).replace("{", "{{")
                               .replace("}", "}}"))
            entry["roles"], entry["turn_separator"] = roles, sep or "\n"
    template = PolicyTemplate(text=text, source="read off the training rows")
    report = {"rows": len(rows), "checked": 0, "mismatched": 0, "examples": []}
    for r in rows:
        if not r.get("history"):
            continue
        report["checked"] += 1
        ok = template.matches(r["messages"], r["history"], r["language"],
                              r.get("modality") == "visual")
        if not ok:
            report["mismatched"] += 1
            if len(report["examples"]) < 5:
                report["examples"].append(str(r.get("id", "?")))
    return template, report



def training_template(rows: list[dict]) -> tuple[PolicyTemplate, str]:
    """The template saved with a policy trained on `rows`, and a line saying how well it
    reproduces their prompts (rows without a `history` cannot be checked and are counted)."""
    template, report = fit_policy_template(rows)
    if template.text == _builtin_text():
        template = PolicyTemplate()
    unchecked = report["rows"] - report["checked"]
    line = (f"policy prompt ({'built-in' if template == PolicyTemplate() else 'read off the rows'}"
            f"): {report['checked'] - report['mismatched']}/{report['checked']} training "
            f"prompt(s) are what it builds; saved as {TEMPLATE_FILE} with the policy, which "
            "the evaluations build prompts from")
    if report["mismatched"]:
        line += (f". warning: {report['mismatched']} prompt(s) are worded otherwise (e.g. "
                 f"{', '.join(report['examples'])}): evaluated prompts will not read like them")
    if unchecked:
        line += f"; {unchecked} row(s) have no history to check"
    return template, line
