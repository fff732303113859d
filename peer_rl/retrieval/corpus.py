"""The exemplars an index is built from: ESC-Preference files read and validated."""
from __future__ import annotations

import hashlib
from pathlib import Path


def load_exemplars(data: str | Path, skip_invalid: bool = False) -> tuple[list[dict], dict]:
    """Exemplars from a root with exemplars/ (else preference/: the chosen replies), or from one
    such .jsonl file; rows are validated like every subset (`path:line: field`)."""
    from peer_rl.data.layout import DataFile, discover
    from peer_rl.data.loading import InvalidDataError
    from peer_rl.data.validate import check_file

    data = Path(data)
    if data.is_file():
        subset = "preference" if data.parent.name == "preference" else "exemplars"
        files = [DataFile(data, subset, data.parent, None, None)]
    else:
        found = discover(data)
        files = [f for f in found if f.subset == "exemplars"] or \
            [f for f in found if f.subset == "preference"]
        if not files:
            raise FileNotFoundError(f"{data}: no exemplars/*.jsonl or preference/*.jsonl")
    reports = [check_file(f) for f in files]
    if not skip_invalid and any(r.problems for r in reports):
        raise InvalidDataError(reports)
    rows, digest = [], hashlib.sha256()
    for rep in reports:
        digest.update(rep.file.path.read_bytes())
        for r in rep.rows:
            if rep.file.subset == "preference":
                r = {"id": r["id"], "language": r["language"], "history": r["history"],
                     "response": r["chosen"], "source": r.get("source", ""),
                     **({"dialogue": r["dialogue"]} if r.get("dialogue") else {})}
            rows.append(r)
    skipped = sum(r.n_invalid for r in reports)
    return rows, {"files": [str(r.file.path) for r in reports], "skipped": skipped,
                  "sha256": digest.hexdigest()}
