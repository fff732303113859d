"""Row-level validation of PEER-layout JSONL files, and normalisation into one in-memory form.

Every problem is reported as `path:line: field: what was expected`, so a researcher can open
the file at the line. Reading is done on raw bytes so that invalid UTF-8 and truncated JSON are
reported per line instead of aborting the whole file. A valid row is returned normalised (see
peer_rl.data.vocab): the card's spellings (`language: english`, `modality: textual`, integer
ids, seeker turns as plain strings) and peer-rl's own (`en`, `text`, string ids) load alike.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from peer_rl.data.escrag import PASSES, PERSPECTIVES, canonical_pass
from peer_rl.data.layout import DataFile
from peer_rl.data.vocab import (LANGS, LANGUAGE_ALIASES, MODALITY_ALIASES, infer_language,
                                language_of, modality_of, role_of, split_role_lines)
from peer_rl.prompts.judge import PREFERENCE_VERDICTS, STEP_VERDICTS
from peer_rl.prompts.multimodal import (IMAGE_FORMATS, IMAGE_TAG, MAX_IMAGE_PIXELS, ImageRefused,
                                 count_tags, open_image)
from peer_rl.prompts.escrag import parse_reasoned
from peer_rl.prompts.reasoning import parse_structured

SAFETY_GROUPS = ("crisis", "harmful_request", "boundary")
SER_SOURCES = ("original", "augmented")
SER_ROLES = ["system"] + ["user", "assistant"] * 4
_LANG_WORDS = "/".join(LANGUAGE_ALIASES)
_MODALITY_WORDS = "/".join(MODALITY_ALIASES)


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    field: str
    expected: str
    reason: str  # short category for --skip-invalid counts

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.field}: {self.expected}"


@dataclass
class FileReport:
    file: DataFile
    rows: list[dict] = field(default_factory=list)        # valid rows, normalised, in file order
    lines: list[int] = field(default_factory=list)        # their 1-based line numbers
    problems: list[Problem] = field(default_factory=list)
    n_lines: int = 0

    @property
    def n_invalid(self) -> int:
        return len({p.line for p in self.problems})

    def reasons(self) -> Counter:
        return Counter(p.reason for p in self.problems)


ALLOW_OUTSIDE_ENV = "PEER_RL_ALLOW_IMAGES_OUTSIDE_ROOT"


def images_may_leave_root() -> bool:
    return os.environ.get(ALLOW_OUTSIDE_ENV) == "1"


class _Row:
    """Collects the problems of one row and builds its normalised form in `out`."""

    def __init__(self, df: DataFile, line: int, row: dict):
        self.df, self.line, self.row, self.problems = df, line, row, []
        self.out: dict = {}

    def bad(self, fld: str, expected: str, reason: str) -> None:
        self.problems.append(Problem(str(self.df.path), self.line, fld, expected, reason))

    def get(self, key: str, types, what: str, required: bool = True):
        if key not in self.row or self.row[key] is None:
            if required:
                self.bad(key, f"missing; expected {what}", "missing field")
            return None
        value = self.row[key]
        if not isinstance(value, types) or isinstance(value, bool):
            self.bad(key, f"expected {what}, found {type(value).__name__}", "wrong type")
            return None
        return value

    def text(self, key: str, required: bool = True) -> str | None:
        value = self.get(key, str, "a non-empty string", required)
        if value is not None and not value.strip():
            self.bad(key, "expected a non-empty string, found an empty one", "empty field")
            return None
        if value is not None:
            self.out[key] = value
        return value

    def row_id(self, required: bool) -> None:
        """`id`: a string or an integer (the card's ser ids), kept as a string; derived from
        file and line when the layout lists none (grpo rows)."""
        value = self.get("id", (str, int), "a non-empty string or an integer", required)
        if isinstance(value, str) and not value.strip():
            self.bad("id", "expected a non-empty string or an integer, found an empty string",
                     "empty field")
            return
        if value is None and not required and self.row.get("id") is None:  # absent or null
            self.out["id"] = f"{self.df.rel}:{self.line}"
        elif value is not None:
            self.out["id"] = str(value)

    def choice(self, key: str, allowed, required: bool = True) -> str | None:
        value = self.get(key, str, f"one of {', '.join(allowed)}", required)
        if value is not None and value not in allowed:
            self.bad(key, f"expected one of {', '.join(allowed)}, found {value!r}", "bad value")
            return None
        if value is not None:
            self.out[key] = value
        return value

    def alias(self, key: str, normalise, words: str, required: bool = True,
              out_key: str | None = None) -> str | None:
        """A field with several accepted spellings (vocab.*_ALIASES), stored canonical."""
        value = self.get(key, str, f"one of {words}", required)
        if value is None:
            return None
        canonical = normalise(value)
        if canonical is None:
            self.bad(key, f"expected one of {words}, found {value!r}", "bad value")
            return None
        self.out[out_key or key] = canonical
        return canonical

    def history(self, key: str = "history", default_role: str | None = None) -> list | None:
        """Turns as {"role": seeker|supporter, "content"}; also accepted: {speaker|role,
        content|text} dicts with the role names of vocab.ROLE_ALIASES, plain strings (seeker
        turns when `default_role` is "seeker"; otherwise roles alternate, ending with the
        seeker, unless a string starts "Seeker:"/"求助者：" ...), or one string of such lines."""
        value = self.row.get(key)
        what = "a non-empty list of {role, content} turns or of strings"
        if value is None:
            self.bad(key, f"missing; expected {what}", "missing field")
            return None
        if isinstance(value, str):
            value = split_role_lines(value) or [value]
        if not isinstance(value, list):
            self.bad(key, f"expected {what}, found {type(value).__name__}", "wrong type")
            return None
        if not value:
            self.bad(key, "expected a non-empty dialogue history, found []", "empty history")
            return None
        turns, n = [], len(value)
        for i, t in enumerate(value):
            if isinstance(t, str):
                split = split_role_lines(t)
                if split and len(split) == 1:
                    turn = split[0]
                else:
                    role = default_role or ("seeker" if (n - 1 - i) % 2 == 0 else "supporter")
                    turn = {"role": role, "content": t}
            elif isinstance(t, dict):
                role = role_of(t.get("role", t.get("speaker")))
                content = next((t[k] for k in ("content", "text", "utterance") if k in t), None)
                turn = {"role": role, "content": content}
            else:
                turn = {"role": None, "content": None}
            if turn["role"] is None or not isinstance(turn["content"], str) \
                    or not turn["content"].strip():
                self.bad(f"{key}[{i}]", "expected {\"role\": \"seeker\"|\"supporter\" (or user/"
                         "assistant, speaker/listener, ...), \"content\": non-empty string} or a "
                         "non-empty string", "bad history turn")
                continue
            turns.append(turn)
        if len(turns) == n:
            self.out[key] = turns
            return turns
        return None

    def images(self, n: int | None, visual: bool | None) -> None:
        if visual is False:
            if self.row.get("images"):
                self.bad("images", "expected no images in a text file", "unexpected images")
            self.out["images"] = []
            return
        imgs = self.get("images", list, "a list of image paths", required=bool(visual))
        if imgs is None:
            self.out["images"] = []
            return
        if n is not None and len(imgs) != n:
            self.bad("images", f"expected {n} image path(s), found {len(imgs)}", "image count")
        for i, rel in enumerate(imgs):
            if not isinstance(rel, str):
                self.bad(f"images[{i}]", "expected a path string", "wrong type")
                continue
            path = self.df.subset_dir / rel
            root = self.df.subset_dir.parent
            if not images_may_leave_root() and (
                    Path(rel).is_absolute() or not path.resolve().is_relative_to(root.resolve())):
                self.bad(f"images[{i}]", f"a path inside the data root {root}; {rel!r} leaves it "
                         f"(set {ALLOW_OUTSIDE_ENV}=1 to allow)", "image outside root")
                continue
            if not path.is_file():
                self.bad(f"images[{i}]", f"image file {path} does not exist", "missing image")
                continue
            try:
                open_image(path)
            except ImageRefused as exc:
                self.bad(f"images[{i}]", f"a {'/'.join(IMAGE_FORMATS)} image of at most "
                         f"{MAX_IMAGE_PIXELS:,} pixels; {exc}", "refused image")
            except Exception as exc:  # PIL raises many types for undecodable files
                self.bad(f"images[{i}]", f"a decodable image; {path}: {exc}", "undecodable image")
        self.out["images"] = list(imgs)

    def image_tags(self) -> None:
        """`<image>` tags in the chat, when present, must be one per image (peer_rl.prompts.multimodal
        places each image at its tag)."""
        msgs, imgs = self.out.get("messages"), self.out.get("images") or []
        tags = count_tags(msgs) if msgs is not None else 0
        if tags and tags != len(imgs):
            self.bad("messages", f"expected one {IMAGE_TAG} tag per image ({len(imgs)}), found "
                     f"{tags}", "image tags")

    def chat(self, key: str = "messages") -> list | None:
        msgs = self.get(key, list, "a list of {role, content} messages")
        if msgs is None:
            return None
        ok = True
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) \
                    or not isinstance(m.get("content"), str):
                self.bad(f"{key}[{i}]", "expected {\"role\": str, \"content\": str}", "bad message")
                ok = False
        if ok:
            self.out[key] = [{"role": m["role"], "content": m["content"]} for m in msgs]
        return msgs if ok else None


def _check_ser(r: _Row) -> None:
    lang = r.alias("lang", language_of, _LANG_WORDS)
    if lang and r.df.lang and lang != r.df.lang:
        r.bad("lang", f"expected {r.df.lang!r} (the file is under ser/{r.df.lang}/), found "
              f"{r.row['lang']!r}", "language mismatch")
    lang = lang or r.df.lang
    r.row_id(required=True)
    r.choice("source", SER_SOURCES)
    r.images(1, r.df.visual)
    msgs = r.chat()
    if msgs is None:
        return
    r.image_tags()
    roles = [m["role"] for m in msgs]
    if len(msgs) != 9:
        r.bad("messages", f"expected 9 messages (system + 4 x user/assistant), found {len(msgs)}",
              "ser chat length")
        return
    if roles != SER_ROLES:
        first = next(i for i, (a, b) in enumerate(zip(roles, SER_ROLES)) if a != b)
        r.bad(f"messages[{first}].role", f"expected {SER_ROLES[first]!r}, found {roles[first]!r}",
              "ser roles")
        return
    for i, m in enumerate(msgs):
        if not m["content"].strip():
            r.bad(f"messages[{i}].content", "expected non-empty text", "empty message")
    if lang not in LANGS:
        return
    for k, idx in enumerate((2, 4, 6), start=1):
        v = msgs[idx]["content"].strip()
        if v not in STEP_VERDICTS[lang]:
            r.bad(f"messages[{idx}].content", f"step {k} verdict in {lang}: one of "
                  f"{' / '.join(STEP_VERDICTS[lang])}, found {v!r}", "verdict vocabulary")
    v = msgs[8]["content"].strip()
    if v not in PREFERENCE_VERDICTS[lang]:
        r.bad("messages[8].content", f"preference verdict in {lang}: one of "
              f"{' / '.join(PREFERENCE_VERDICTS[lang])}, found {v!r}", "verdict vocabulary")


def _language(r: _Row) -> str | None:
    """`language` (the card's key) or `lang`; either spelling of either language."""
    key = "language" if "language" in r.row or "lang" not in r.row else "lang"
    return r.alias(key, language_of, _LANG_WORDS, out_key="language")


def _modality(r: _Row) -> str | None:
    """`modality`, or the file's kind (textual/visual in its name) when the row has none."""
    if "modality" not in r.row and r.df.visual is not None:
        r.out["modality"] = "visual" if r.df.visual else "text"
        return r.out["modality"]
    modality = r.alias("modality", modality_of, _MODALITY_WORDS)
    if modality and r.df.visual is not None and (modality == "visual") != r.df.visual:
        r.bad("modality", f"expected {'visual' if r.df.visual else 'textual'} in "
              f"{r.df.path.name}, found {r.row['modality']!r}", "modality mismatch")
    return modality


def _check_sft(r: _Row) -> None:
    r.row_id(required=False)
    _language(r)
    modality = _modality(r)
    visual = r.df.visual if r.df.visual is not None else modality == "visual"
    r.images(None, visual)
    msgs = r.chat()
    if msgs is None:
        return
    r.image_tags()
    if len(msgs) < 2 or msgs[-1]["role"] != "assistant" or msgs[-2]["role"] != "user":
        r.bad("messages", "expected a chat ending with a user turn then the assistant target",
              "sft chat")
        return
    if not parse_structured(msgs[-1]["content"]).complete:
        r.bad("messages[-1].content", "expected a target with Steps 1-4 in order, each non-empty",
              "sft format")


def _check_grpo(r: _Row) -> None:
    r.row_id(required=False)
    _language(r)
    modality = _modality(r)
    r.text("source")
    r.text("solution")
    for key in ("strategy", "dialogue"):
        if key in r.row:
            r.text(key, required=False)
    r.history()
    msgs = r.chat()
    if msgs is not None and (not msgs or msgs[-1]["role"] != "user"):
        r.bad("messages", "expected the policy prompt chat, ending with a user turn", "grpo chat")
    visual = r.df.visual if r.df.visual is not None else modality == "visual"
    r.images(2, visual)
    r.image_tags()


def _check_safety(r: _Row) -> None:
    r.row_id(required=True)
    turns = r.history(default_role="seeker")
    r.text("category")
    r.choice("group", SAFETY_GROUPS)
    r.text("source")
    if "language" in r.row or "lang" in r.row:
        _language(r)
    elif turns:
        r.out["language"] = infer_language([t["content"] for t in turns])


def _dialogue_end(r: _Row, turns: list | None, answered: str) -> None:
    if turns and turns[-1]["role"] != "seeker":
        r.bad("history", f"expected the last turn to be the seeker's (the turn {answered} "
              "answers)", "history end")


def _check_preference(r: _Row) -> None:
    """ESC-Preference pairs (peer_rl.data.escrag)."""
    r.row_id(required=True)
    _language(r)
    _dialogue_end(r, r.history(), "chosen/rejected")
    chosen, rejected = r.text("chosen"), r.text("rejected")
    if chosen is not None and chosen == rejected:
        r.bad("rejected", "expected a reply different from chosen", "identical pair")
    if "dialogue" in r.row:
        r.text("dialogue", required=False)
    scores = r.row.get("scores")
    if scores is None:
        return
    what = ("an object {chosen, rejected} of {client, counselor, judge} numbers in [0, 10]")
    ok = isinstance(scores, dict) and set(scores) <= {"chosen", "rejected"} and all(
        isinstance(v, dict) and set(v) <= set(PERSPECTIVES) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 10
            for x in v.values()) for v in scores.values())
    if not ok:
        r.bad("scores", f"expected {what}", "bad scores")
    else:
        r.out["scores"] = scores


def _check_exemplars(r: _Row) -> None:
    """The ESCRAG-R1 retrieval corpus (peer_rl.data.escrag)."""
    r.row_id(required=True)
    _language(r)
    _dialogue_end(r, r.history(), "response")
    r.text("response")
    for key in ("strategy", "source", "dialogue"):
        if key in r.row:
            r.text(key, required=False)


def _check_cold_start(r: _Row) -> None:
    """ESCRAG-R1 cold-start demonstrations (peer_rl.data.escrag)."""
    r.row_id(required=True)
    _language(r)
    if "pass" in r.row:        # "final", pass 2's old spelling, is stored as "refined"
        r.alias("pass", canonical_pass, ", ".join(PASSES))
    if "source" in r.row:
        r.text("source", required=False)
    msgs = r.chat()
    if msgs is None:
        return
    if len(msgs) < 2 or msgs[-1]["role"] != "assistant" or msgs[-2]["role"] != "user":
        r.bad("messages", "expected a chat ending with a user turn then the assistant target",
              "cold-start chat")
        return
    if not parse_reasoned(msgs[-1]["content"]).complete:
        r.bad("messages[-1].content", "expected <think>reasoning</think> then a non-empty reply "
              "(one think block)", "cold-start format")


CHECKERS = {"ser": _check_ser, "sft": _check_sft, "grpo": _check_grpo, "safety": _check_safety,
            "preference": _check_preference, "exemplars": _check_exemplars,
            "cold_start": _check_cold_start}


def check_file(df: DataFile) -> FileReport:
    report = FileReport(df)
    with open(df.path, "rb") as fh:
        raw_lines = fh.read().split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    report.n_lines = len(raw_lines)
    seen_ids: dict[str, int] = {}
    for lineno, raw in enumerate(raw_lines, start=1):
        where = str(df.path)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            report.problems.append(Problem(where, lineno, "<line>",
                                           f"valid UTF-8; invalid byte at column {exc.start + 1}",
                                           "invalid utf-8"))
            continue
        if not text.strip():
            report.problems.append(Problem(where, lineno, "<line>", "a JSON object, found a blank line",
                                           "blank line"))
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            report.problems.append(Problem(where, lineno, "<line>",
                                           f"a complete JSON object; {exc.msg} at column {exc.colno}",
                                           "invalid json"))
            continue
        except RecursionError:
            report.problems.append(Problem(where, lineno, "<line>",
                                           "a JSON object of ordinary depth; found one nested "
                                           "too deep to read", "nested too deep"))
            continue
        if not isinstance(row, dict):
            report.problems.append(Problem(where, lineno, "<line>",
                                           f"a JSON object, found {type(row).__name__}", "not an object"))
            continue
        r = _Row(df, lineno, row)
        CHECKERS[df.subset](r)
        rid = r.out.get("id")
        if rid is not None:
            if rid in seen_ids:
                r.bad("id", f"unique within the file; {rid!r} already on line {seen_ids[rid]}",
                      "duplicate id")
            seen_ids.setdefault(rid, lineno)
        if r.problems:
            report.problems.extend(r.problems)
        else:
            report.rows.append(r.out)
            report.lines.append(lineno)
    return report
