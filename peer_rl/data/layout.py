"""Where each subset's files live in a PEER-layout root (docs/your-data.md)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SUBSETS = ("ser", "sft", "grpo", "safety", "preference", "exemplars", "cold_start")
SPLITS = ("train", "test")


def file_split(path: str | Path) -> str:
    """A file's split, from its name as the layout writes it: `test.jsonl` or `*_test.jsonl` is
    the test split; every other name (`train.jsonl`, `text_train.jsonl`, `textual.jsonl`,
    `exemplars.jsonl`) is train."""
    stem = Path(path).stem
    return "test" if stem == "test" or stem.endswith("_test") else "train"


@dataclass(frozen=True)
class DataFile:
    path: Path
    subset: str            # ser | sft | grpo | safety
    subset_dir: Path       # image paths in rows are relative to this
    lang: str | None       # from the path when the layout fixes it (ser/<lang>/...)
    visual: bool | None    # from the file name when the layout fixes it

    @property
    def split(self) -> str:
        return file_split(self.path)

    @property
    def rel(self) -> str:
        return str(self.path.relative_to(self.subset_dir.parent))


def discover(root: str | Path) -> list[DataFile]:
    """Every *.jsonl under <root>/{ser,sft,grpo,safety}, sorted; an empty or missing root raises."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory (expected a PEER-layout root with "
                                f"{', '.join(s + '/' for s in SUBSETS)})")
    files = []
    for subset in SUBSETS:
        sdir = root / subset
        for path in sorted(sdir.rglob("*.jsonl")) if sdir.is_dir() else []:
            rel = path.relative_to(sdir).parts
            lang = rel[0] if subset == "ser" and len(rel) > 1 else None
            stem = path.stem
            visual = ("visual" in stem) if subset in ("ser", "sft", "grpo") else None
            files.append(DataFile(path, subset, sdir, lang, visual))
    if not files:
        raise FileNotFoundError(f"{root}: no *.jsonl files under {', '.join(s + '/' for s in SUBSETS)}")
    return files
