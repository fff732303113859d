"""Import ESConv-format dialogues as grpo rows (history up to a supporter turn -> solution).

Accepts the main ESConv file's seeker/supporter speakers and FailedESConv's speaker/listener.
Consecutive turns by one speaker are merged into one utterance, so a "round" is one supporter
reply, and the strategy of a merged supporter turn is that of its first annotated part.
A turn's `content` is a string and its `annotation`, where present, an object whose `strategy`
is a string: anything else stops the import naming the turn (`FILE[dialogue].dialog[turn]`),
never read as the text "None" or "['a', 'b']".
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from peer_rl.data.round_sampling import gaussian_round_sample
from peer_rl.prompts.reasoning import policy_messages

SPEAKERS = {"seeker": "seeker", "usr": "seeker", "speaker": "seeker",
            "supporter": "supporter", "sys": "supporter", "listener": "supporter"}
STRATEGY_ALIASES = {
    "questions": "Question", "question": "Question",
    "restatement or paraphrasing": "Restatement or Paraphrasing", "restatement": "Restatement or Paraphrasing",
    "paraphrasing": "Restatement or Paraphrasing",
    "reflection of feelings": "Reflection of Feelings",
    "self-disclosure": "Self-disclosure",
    "affirmation and reassurance": "Affirmation and Reassurance",
    "approval and reassurance": "Affirmation and Reassurance",
    "providing suggestions": "Providing Suggestions", "direct guidance": "Providing Suggestions",
    "information": "Information",
    "others": "Others", "other": "Others",
}


def normalise_strategy(name: str | None) -> str | None:
    if not name:
        return None
    return STRATEGY_ALIASES.get(name.strip().lower())


@dataclass
class ImportReport:
    dialogues: int = 0
    rows: int = 0
    skipped: Counter = field(default_factory=Counter)   # reason -> count (dialogues or turns)
    unknown_strategies: Counter = field(default_factory=Counter)
    kept_rounds: list = field(default_factory=list)     # (round, rounds in its dialogue) per row


def _json_type(value) -> str:
    """A value's JSON type, as an error names what it found."""
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _merge_turns(dialog: list[dict], where: str) -> list[dict]:
    merged: list[dict] = []
    for j, turn in enumerate(dialog):
        if not isinstance(turn, dict):
            raise ValueError(f"{where}.dialog[{j}]: expected an object with speaker and content")
        role = SPEAKERS.get(str(turn.get("speaker", "")).lower())
        if role is None:
            raise ValueError(f"{where}.dialog[{j}].speaker: expected one of "
                             f"{sorted(SPEAKERS)}, found {turn.get('speaker')!r}")
        content = turn.get("content", "")
        if not isinstance(content, str):
            raise ValueError(f"{where}.dialog[{j}].content: expected a string, found "
                             f"{_json_type(content)}")
        text = content.strip()
        if not text:
            continue
        annotation = turn.get("annotation") or {}
        if not isinstance(annotation, dict):
            raise ValueError(f"{where}.dialog[{j}].annotation: expected an object (e.g. "
                             f"{{\"strategy\": \"Question\"}}), found {_json_type(annotation)}")
        strategy = annotation.get("strategy")
        if strategy is not None and not isinstance(strategy, str):
            raise ValueError(f"{where}.dialog[{j}].annotation.strategy: expected a string, "
                             f"found {_json_type(strategy)}")
        if merged and merged[-1]["role"] == role:
            merged[-1]["content"] += " " + text
            merged[-1]["strategy"] = merged[-1]["strategy"] or strategy
        else:
            merged.append({"role": role, "content": text, "strategy": strategy})
    return merged


def import_esconv(path: str | Path, rounds_per_dialogue: int = 3, seed: int = 0,
                  language: str = "en") -> tuple[list[dict], ImportReport]:
    """grpo-format rows from an ESConv JSON file, plus a report of what was skipped and why."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable ESConv JSON file: {exc}") from exc
    except RecursionError:
        raise ValueError(f"{path}: not a readable ESConv JSON file: nested too deep") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of dialogues, found {type(data).__name__}")
    rng = np.random.default_rng(seed)
    report, rows = ImportReport(), []
    for i, dlg in enumerate(data):
        where = f"{path}[{i}]"
        if not isinstance(dlg, dict) or not isinstance(dlg.get("dialog"), list):
            report.skipped["no dialog list"] += 1
            continue
        report.dialogues += 1
        turns = _merge_turns(dlg["dialog"], where)
        # a round = a supporter turn with at least one seeker turn before it
        rounds = [t for t, turn in enumerate(turns)
                  if turn["role"] == "supporter" and any(x["role"] == "seeker" for x in turns[:t])]
        if not rounds:
            report.skipped["dialogue without a supporter reply after a seeker turn"] += 1
            continue
        for r in gaussian_round_sample(len(rounds), rounds_per_dialogue, rng):
            t = rounds[r - 1]
            report.kept_rounds.append((r, len(rounds)))
            history = [{"role": x["role"], "content": x["content"]} for x in turns[:t]]
            strategy = normalise_strategy(turns[t]["strategy"])
            if turns[t]["strategy"] and strategy is None:
                report.unknown_strategies[turns[t]["strategy"]] += 1
            rows.append({
                "id": f"esconv-{i:05d}-r{r:02d}",
                "dialogue": f"esconv-{i:05d}",        # retrieval never returns its own dialogue
                "messages": policy_messages(history, language),
                "history": history,
                "solution": turns[t]["content"],
                "language": {"en": "english", "zh": "chinese"}[language],   # the card's spellings
                "modality": "textual",
                "source": "ESConv",                                        # the originating corpus
                "strategy": strategy or "",
            })
    report.rows = len(rows)
    return rows, report


