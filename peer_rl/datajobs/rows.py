"""Input rows of a data job: each with its file, line, raw JSON line and normalised form.

Output files are written from the raw lines, so a row that a job keeps leaves it byte for
byte as it came in (the card's spellings, field order, extra fields)."""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

from peer_rl.data.layout import DataFile, discover
from peer_rl.data.validate import check_file
from peer_rl.data.vocab import ROLE_ALIASES, split_role_lines


class InvalidInput(ValueError):
    """Input rows that fail validation, named `path:line: field: expected`."""


@dataclass(frozen=True)
class Row:
    file: str            # path relative to the root, e.g. grpo/textual.jsonl
    line: int            # 1-based
    raw: bytes           # the line as read, without its newline
    data: dict           # normalised (peer_rl.data.validate)

    @property
    def key(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class Loaded:
    rows: list[Row]
    files: list[str]                # every matched file, relative to the root
    invalid: list[str]              # `path:line: field: expected ...` of the rows left out


def load_rows(root: str | Path, subsets=(), pattern: str = "", skip_invalid: bool = False
              ) -> Loaded:
    """Rows of the files of `subsets` (or those matching `pattern`, relative to the root)."""
    root = Path(root)
    files = [df for df in discover(root)
             if (df.subset in subsets if subsets else True)
             and (fnmatch.fnmatch(_rel(df, root), pattern) if pattern else True)]
    if not files:
        what = f"files matching {pattern!r}" if pattern else f"files of {', '.join(subsets)}"
        raise FileNotFoundError(f"{root}: no {what}")
    rows, invalid = [], []
    for df in files:
        report = check_file(df)
        invalid += [f"{p.path}:{p.line}: {p.field}: {p.expected}" for p in report.problems]
        raw = df.path.read_bytes().split(b"\n")
        rel = _rel(df, root)
        rows += [Row(rel, n, raw[n - 1], data) for n, data in zip(report.lines, report.rows)]
    if invalid and not skip_invalid:
        shown = "\n  ".join(invalid[:20])
        more = f"\n  ... {len(invalid) - 20} more" if len(invalid) > 20 else ""
        raise InvalidInput(f"{root}: {len(invalid)} problem(s) in the input (skip_invalid=true "
                           f"leaves those rows out, counted):\n  {shown}{more}")
    return Loaded(rows, [_rel(df, root) for df in files], invalid)


def _rel(df: DataFile, root: Path) -> str:
    return df.path.relative_to(root).as_posix()


def row_source(row: Row) -> str:
    """What the report groups by: the row's `source` (the originating corpus), else its file."""
    return str(row.data.get("source") or row.file)


def dialogue_turns(row: Row) -> list[dict]:
    """The conversation a row holds, as {role, content} turns: its history and the supporter
    reply it pairs with it (grpo `solution`, exemplar `response`, preference `chosen`)."""
    turns = list(row.data.get("history") or [])
    for key in ("solution", "response", "chosen"):
        if row.data.get(key):
            turns.append({"role": "supporter", "content": row.data[key]})
            break
    return turns


_ROLE_START = re.compile(r"^\s*(" + "|".join(re.escape(k) for k in ROLE_ALIASES) + r")\s*[:：]",
                         re.IGNORECASE | re.MULTILINE)


def ser_history(row: Row) -> list[dict] | None:
    """The dialogue history of an SER row: the role-prefixed lines (`Seeker: ...`,
    `求助者：...`) of its first user turn, up to the first blank line. None when it has none."""
    first = next((m["content"] for m in row.data["messages"] if m["role"] == "user"), "")
    m = _ROLE_START.search(first)
    if m is None:
        return None
    block = first[m.start():].split("\n\n", 1)[0]
    return split_role_lines(block)
