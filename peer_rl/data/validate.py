"""Row-level validation of PEER-layout JSONL files.

Every problem is reported as `path:line: field: what was expected`, so a researcher can open
the file at the line. Reading is done on raw bytes so that invalid UTF-8 and truncated JSON are
reported per line instead of aborting the whole file.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from PIL import Image

from peer_rl.data.layout import DataFile
from peer_rl.judge_prompt import PREFERENCE_VERDICTS, STEP_VERDICTS
from peer_rl.reasoning import parse_structured

LANGS = ("en", "zh")
SAFETY_GROUPS = ("crisis", "harmful_request", "boundary")
SOURCES = ("original", "augmented")
SER_ROLES = ["system"] + ["user", "assistant"] * 4


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
    rows: list[dict] = field(default_factory=list)        # valid rows, in file order
    lines: list[int] = field(default_factory=list)        # their 1-based line numbers
    problems: list[Problem] = field(default_factory=list)
    n_lines: int = 0

    @property
    def n_invalid(self) -> int:
        return len({p.line for p in self.problems})

    def reasons(self) -> Counter:
        return Counter(p.reason for p in self.problems)


class _Row:
    """Collects the problems of one row."""

    def __init__(self, df: DataFile, line: int, row: dict):
        self.df, self.line, self.row, self.problems = df, line, row, []

    def bad(self, fld: str, expected: str, reason: str) -> None:
        self.problems.append(Problem(str(self.df.path), self.line, fld, expected, reason))

    def get(self, key: str, types, what: str, required: bool = True):
        if key not in self.row:
            if required:
                self.bad(key, f"missing; expected {what}", "missing field")
            return None
        value = self.row[key]
        if not isinstance(value, types):
            self.bad(key, f"expected {what}, found {type(value).__name__}", "wrong type")
            return None
        return value

    def text(self, key: str, required: bool = True) -> str | None:
        value = self.get(key, str, "a non-empty string", required)
        if value is not None and not value.strip():
            self.bad(key, "expected a non-empty string, found an empty one", "empty field")
            return None
        return value

    def choice(self, key: str, allowed, required: bool = True) -> str | None:
        value = self.get(key, str, f"one of {', '.join(allowed)}", required)
        if value is not None and value not in allowed:
            self.bad(key, f"expected one of {', '.join(allowed)}, found {value!r}", "bad value")
            return None
        return value

    def history(self, key: str = "history") -> None:
        turns = self.get(key, list, "a non-empty list of {role, content} turns")
        if turns is None:
            return
        if not turns:
            self.bad(key, "expected a non-empty dialogue history, found []", "empty history")
        for i, t in enumerate(turns):
            if not isinstance(t, dict) or t.get("role") not in ("seeker", "supporter") \
                    or not isinstance(t.get("content"), str) or not t["content"].strip():
                self.bad(f"{key}[{i}]", "expected {\"role\": \"seeker\"|\"supporter\", "
                         "\"content\": non-empty string}", "bad history turn")

    def images(self, n: int | None, visual: bool | None) -> None:
        if visual is False:
            if self.row.get("images"):
                self.bad("images", "expected no images in a text file", "unexpected images")
            return
        imgs = self.get("images", list, "a list of image paths", required=bool(visual))
        if imgs is None:
            return
        if n is not None and len(imgs) != n:
            self.bad("images", f"expected {n} image path(s), found {len(imgs)}", "image count")
        for i, rel in enumerate(imgs):
            if not isinstance(rel, str):
                self.bad(f"images[{i}]", "expected a path string", "wrong type")
                continue
            path = self.df.subset_dir / rel
            if not path.is_file():
                self.bad(f"images[{i}]", f"image file {path} does not exist", "missing image")
                continue
            try:
                with Image.open(path) as im:
                    im.load()
            except Exception as exc:  # PIL raises many types for undecodable files
                self.bad(f"images[{i}]", f"a decodable image; {path}: {exc}", "undecodable image")

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
        return msgs if ok else None


def _check_ser(r: _Row) -> None:
    lang = r.choice("lang", LANGS)
    if lang and r.df.lang and lang != r.df.lang:
        r.bad("lang", f"expected {r.df.lang!r} (the file is under ser/{r.df.lang}/), found {lang!r}",
              "language mismatch")
    lang = lang or r.df.lang
    r.text("id")
    r.choice("source", SOURCES)
    r.images(1, r.df.visual)
    msgs = r.chat()
    if msgs is None:
        return
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


def _check_sft(r: _Row) -> None:
    r.text("id")
    r.choice("language", LANGS)
    r.choice("modality", ("text", "visual"))
    r.images(None, r.df.visual)
    msgs = r.chat()
    if msgs is None:
        return
    if len(msgs) < 2 or msgs[-1]["role"] != "assistant" or msgs[-2]["role"] != "user":
        r.bad("messages", "expected a chat ending with a user turn then the assistant target",
              "sft chat")
        return
    if not parse_structured(msgs[-1]["content"]).complete:
        r.bad("messages[-1].content", "expected a target with Steps 1-4 in order, each non-empty",
              "sft format")


def _check_grpo(r: _Row) -> None:
    r.text("id")
    r.choice("language", LANGS)
    modality = r.choice("modality", ("text", "visual"))
    r.choice("source", SOURCES)
    r.text("solution")
    r.history()
    msgs = r.chat()
    if msgs is not None and (not msgs or msgs[-1]["role"] != "user"):
        r.bad("messages", "expected the policy prompt chat, ending with a user turn", "grpo chat")
    visual = r.df.visual if r.df.visual is not None else modality == "visual"
    if modality and r.df.visual is not None and (modality == "visual") != r.df.visual:
        r.bad("modality", f"expected {'visual' if r.df.visual else 'text'} in {r.df.path.name}, "
              f"found {modality!r}", "modality mismatch")
    r.images(2, visual)


def _check_safety(r: _Row) -> None:
    r.text("id")
    r.history()
    r.text("category")
    r.choice("group", SAFETY_GROUPS)
    r.text("source")
    r.choice("language", LANGS, required=False)


CHECKERS = {"ser": _check_ser, "sft": _check_sft, "grpo": _check_grpo, "safety": _check_safety}


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
        if not isinstance(row, dict):
            report.problems.append(Problem(where, lineno, "<line>",
                                           f"a JSON object, found {type(row).__name__}", "not an object"))
            continue
        r = _Row(df, lineno, row)
        CHECKERS[df.subset](r)
        rid = row.get("id")
        if isinstance(rid, str):
            if rid in seen_ids:
                r.bad("id", f"unique within the file; {rid!r} already on line {seen_ids[rid]}",
                      "duplicate id")
            seen_ids.setdefault(rid, lineno)
        if r.problems:
            report.problems.extend(r.problems)
        else:
            report.rows.append(row)
            report.lines.append(lineno)
    return report
