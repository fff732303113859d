"""The exemplars an index is built from: ESC-Preference files read and validated.

Only the files of the named splits are read (default: train). A file's split comes from its name
(peer_rl.data.layout.file_split: `test.jsonl` and `*_test.jsonl` are test). `data preference`
writes `exemplars/test.jsonl` beside `exemplars/train.jsonl`, and the CCJ evaluation asks about
the test contexts: an index holding the test file would hand a test dialogue the chosen replies
of other test dialogues, during GRPO and under RAG inference alike.
"""
from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

from peer_rl.data.layout import DataFile, SPLITS, discover, file_split
from peer_rl.data.validate import check_file
from peer_rl.files.out_paths import read_json
from peer_rl.retrieval.index import INFO_FILE, build_index

logger = logging.getLogger(__name__)

DEFAULT_SPLITS = ("train",)


def parse_splits(value, what: str) -> tuple[str, ...]:
    """`train`, `train,test` or a list of them -> a tuple of known split names."""
    names = [s.strip() for s in (value.split(",") if isinstance(value, str) else value)]
    names = [s for s in names if s]
    bad = [s for s in names if s not in SPLITS]
    if bad or not names:
        raise ValueError(f"{what}: {bad or value!r}: expected one or more of {', '.join(SPLITS)}")
    return tuple(dict.fromkeys(names))


def _rows_in(path: Path) -> int:
    return sum(1 for line in path.read_bytes().split(b"\n") if line.strip())


def load_exemplars(data: str | Path, skip_invalid: bool = False,
                   splits=DEFAULT_SPLITS) -> tuple[list[dict], dict]:
    """Exemplars from a root with exemplars/ (else preference/: the chosen replies), or from one
    such .jsonl file, of the files whose split is in `splits`; rows are validated like every
    subset (`path:line: field`). The second value says what was read: files, sha256 of their
    bytes, rows per split (`splits`), and the rows of the files left out per split
    (`left_out`)."""
    from peer_rl.data.loading import InvalidDataError  # deferred: pulls in datasets

    splits = parse_splits(splits, "splits")
    data = Path(data)
    if data.is_file():
        subset = "preference" if data.parent.name == "preference" else "exemplars"
        found = [DataFile(data, subset, data.parent, None, None)]
    else:
        every = discover(data)
        found = [f for f in every if f.subset == "exemplars"] or \
            [f for f in every if f.subset == "preference"]
        if not found:
            raise FileNotFoundError(f"{data}: no exemplars/*.jsonl or preference/*.jsonl")
    files = [f for f in found if f.split in splits]
    left_out: dict[str, int] = {}
    for f in found:
        if f.split not in splits:
            left_out[f.split] = left_out.get(f.split, 0) + _rows_in(f.path)
    if not files:
        names = ", ".join(f"{f.path} ({f.split})" for f in found)
        raise ValueError(f"{data}: no exemplar file of the split(s) {', '.join(splits)} "
                         f"(found {names}); name the splits to index, e.g. --splits "
                         f"{','.join(sorted({f.split for f in found}))}")
    reports = [check_file(f) for f in files]
    if not skip_invalid and any(r.problems for r in reports):
        raise InvalidDataError(reports)
    rows, digest, per_split = [], hashlib.sha256(), {}
    for rep in reports:
        digest.update(rep.file.path.read_bytes())
        split = file_split(rep.file.path)
        per_split[split] = per_split.get(split, 0) + len(rep.rows)
        for r in rep.rows:
            if rep.file.subset == "preference":
                r = {"id": r["id"], "language": r["language"], "history": r["history"],
                     "response": r["chosen"], "source": r.get("source", ""),
                     **({"dialogue": r["dialogue"]} if r.get("dialogue") else {})}
            rows.append(r)
    skipped = sum(r.n_invalid for r in reports)
    return rows, {"files": [str(r.file.path) for r in reports], "skipped": skipped,
                  "sha256": digest.hexdigest(), "splits": per_split, "left_out": left_out}


def describe(src: dict) -> str:
    """What an index holds, per split, and what was left out: the line `index build` and the
    trainer print before embedding."""
    held = ", ".join(f"{split} {n}" for split, n in src["splits"].items())
    text = (f"{sum(src['splits'].values())} exemplar(s) from {len(src['files'])} file(s) "
            f"({held})")
    if src["left_out"]:
        text += "; left out: " + ", ".join(f"{split} {n} row(s)"
                                          for split, n in sorted(src["left_out"].items()))
    if src["skipped"]:
        text += f"; {src['skipped']} invalid row(s) skipped"
    return text


def index_from_root(root: str | Path, target: str | Path, embedding_model: str,
                    splits=DEFAULT_SPLITS, skip_invalid: bool = False, log=logger.info) -> Path:
    """An index of `root`'s exemplars of `splits` at `target`, built there unless the one
    already there was built from the same files with the same embedding model (the trainer's
    `<output_dir>/index`, the cold start's pass-2 index). `log` gets what it holds."""
    # deferred: tests patch load_embedding_model
    from peer_rl.models.encoders import load_embedding_model

    rows, src = load_exemplars(root, skip_invalid, splits)
    target = Path(target)
    if (target / INFO_FILE).exists():
        info = read_json(target / INFO_FILE, "index info")
        if info.get("source_sha256") == src["sha256"] and \
                info.get("embedding_model") == embedding_model:
            return target
    t0 = time.perf_counter()
    encoder = load_embedding_model(embedding_model)
    info = build_index(rows, encoder.encode, embedding_model, target,
                       source_sha256=src["sha256"], source_splits=src["splits"])
    log(f"exemplar index: {describe(src)} from {root} -> {target} "
        f"({info['kind']}, {time.perf_counter() - t0:.1f} s)")
    return target
