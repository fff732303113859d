"""Load validated PEER-layout files as `datasets.Dataset`s with typed features.

Validation runs first (validate.py) so that a bad row is reported with its path and line; only
then are rows handed to `datasets`, whose Features enforce the column types.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import datasets
from datasets import Features, Sequence, Value

from peer_rl.data.layout import DataFile, discover
from peer_rl.data.validate import FileReport, check_file
from peer_rl.errors import ConfigError

_MSG = [{"role": Value("string"), "content": Value("string")}]
FEATURES = {
    "ser": Features({"id": Value("string"), "lang": Value("string"), "source": Value("string"),
                     "messages": _MSG, "images": Sequence(Value("string"))}),
    "sft": Features({"id": Value("string"), "language": Value("string"),
                     "modality": Value("string"), "messages": _MSG,
                     "images": Sequence(Value("string"))}),
    "grpo": Features({"id": Value("string"), "messages": _MSG, "history": _MSG,
                      "solution": Value("string"), "language": Value("string"),
                      "modality": Value("string"), "source": Value("string"),
                      "images": Sequence(Value("string")), "strategy": Value("string"),
                      "dialogue": Value("string")}),
    "safety": Features({"id": Value("string"), "history": _MSG, "category": Value("string"),
                        "group": Value("string"), "source": Value("string"),
                        "language": Value("string")}),
    "preference": Features({"id": Value("string"), "language": Value("string"), "history": _MSG,
                            "chosen": Value("string"), "rejected": Value("string"),
                            "source": Value("string"), "dialogue": Value("string")}),
    "exemplars": Features({"id": Value("string"), "language": Value("string"), "history": _MSG,
                           "response": Value("string"), "strategy": Value("string"),
                           "source": Value("string"), "dialogue": Value("string")}),
    "cold_start": Features({"id": Value("string"), "language": Value("string"),
                            "messages": _MSG, "pass": Value("string"),
                            "source": Value("string")}),
}


class InvalidDataError(ValueError):
    """Raised when strict loading meets invalid rows; carries every problem found."""

    def __init__(self, reports: list[FileReport]):
        self.problems = [p for r in reports for p in r.problems]
        shown = "\n".join(str(p) for p in self.problems[:20])
        more = f"\n... and {len(self.problems) - 20} more" if len(self.problems) > 20 else ""
        super().__init__(f"{len(self.problems)} problem(s) in the data:\n{shown}{more}\n"
                         "(pass skip_invalid=True / --skip-invalid to drop invalid rows and count them)")


LANGUAGE_NAMES = {"en": "english", "zh": "chinese"}   # SER rows spell `lang` short


def check_in_root(root: str | Path, rel: str, key: str) -> Path:
    """root / rel, which must stay inside root (a `../` path or an absolute one would read
    files from anywhere)."""
    path = Path(root) / rel
    if Path(rel).is_absolute() or not path.resolve().is_relative_to(Path(root).resolve()):
        raise ConfigError(f"{key}: {rel!r} leaves the data root {root}; name files relative "
                          "to it (e.g. grpo/textual.jsonl)")
    return path


def row_language(row: dict) -> str:
    """The row's language in the data card's long spelling (SER rows carry `lang`: en, zh)."""
    lang = row.get("language") or row.get("lang") or ""
    return LANGUAGE_NAMES.get(lang, lang)


@dataclass
class LoadResult:
    dataset: datasets.Dataset
    reports: list[FileReport]
    # rows of a language outside `languages`, per language: filtered on purpose, not invalid
    filtered: dict = field(default_factory=dict)

    @property
    def n_filtered(self) -> int:
        return sum(self.filtered.values())

    @property
    def n_skipped(self) -> int:
        return sum(r.n_invalid for r in self.reports)


def _to_dataset(subset: str, rows: list[dict]) -> datasets.Dataset:
    features = FEATURES[subset]
    cols = {name: [row.get(name) for row in rows] for name in features}
    return datasets.Dataset.from_dict(cols, features=features)


def load_subset(root: str | Path, subset: str, pattern: str = "*", skip_invalid: bool = False,
                languages=()) -> LoadResult:
    """All files of one subset whose name matches `pattern`, validated, as one Dataset; with
    `languages` (the card's spellings: english, chinese), only rows in one of them, the others
    counted per language in `filtered`.

    Image paths are made absolute (they are relative to the subset directory on disk).
    """
    wanted = {LANGUAGE_NAMES.get(x, x) for x in languages}
    if subset not in FEATURES:
        raise ValueError(f"unknown subset {subset!r}; expected one of {sorted(FEATURES)}")
    files: list[DataFile] = [f for f in discover(root) if f.subset == subset
                             and f.path.match(pattern if pattern.endswith(".jsonl") else pattern + ".jsonl")]
    if not files:
        raise FileNotFoundError(f"{root}: no {subset}/ files matching {pattern!r}")
    reports = [check_file(f) for f in files]
    if not skip_invalid and any(r.problems for r in reports):
        raise InvalidDataError(reports)
    rows: list[dict] = []
    filtered: Counter = Counter()
    for rep in reports:
        for row in rep.rows:
            if wanted and row_language(row) not in wanted:
                filtered[row_language(row) or "?"] += 1
                continue
            if row.get("images"):
                row = {**row, "images": [str(rep.file.subset_dir / p) for p in row["images"]]}
            rows.append(row)
    return LoadResult(_to_dataset(subset, rows), reports, dict(filtered))


def located_ser_rows(root, train_files, skip_invalid: bool = False) -> list[tuple[str, dict]]:
    """("path:line", row) for the validated rows of the ser/ entries of `train_files` (globs in
    the file part, as `data.train_files` takes them); other subsets are ignored."""
    found = [f for f in discover(root) if f.subset == "ser"]
    out = []
    for rel in train_files:
        parts = Path(rel).parts
        if not parts or parts[0] != "ser":
            continue
        pattern = str(Path(*parts[1:])) if len(parts) > 1 else "*"
        pattern = pattern if pattern.endswith(".jsonl") else pattern + ".jsonl"
        files = [f for f in found if f.path.match(pattern)]
        if not files:
            raise FileNotFoundError(f"{root}: no ser/ files matching {rel!r}")
        reports = [check_file(f) for f in files]
        if not skip_invalid and any(r.problems for r in reports):
            raise InvalidDataError(reports)
        for rep in reports:
            out += [(f"{rep.file.path}:{line}", row) for row, line in zip(rep.rows, rep.lines)]
    return out
