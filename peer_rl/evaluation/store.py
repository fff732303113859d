"""A run directory that survives being killed: one JSON line per finished case.

A case is appended (flushed and fsynced) only once every one of its turns and scores exist, so
a rerun on the same directory skips exactly the cases on file and redoes the rest: none lost,
none counted twice. A line cut off by a kill is dropped on reopen (and reported). The manifest
pins what the cases were produced with; a rerun with different protocol settings or parties
is refused instead of mixing two evaluations in one file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

CASES_FILE = "cases.jsonl"
MANIFEST_FILE = "run.json"


class RunMismatch(ValueError):
    pass


class RunStore:
    def __init__(self, out_dir: str | Path, manifest: dict):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / CASES_FILE
        self.torn_lines = 0
        self._check_manifest(manifest)
        self.records: dict[str, dict] = {}
        self._load()

    def _check_manifest(self, manifest: dict) -> None:
        path = self.dir / MANIFEST_FILE
        if path.exists():
            old = json.loads(path.read_text(encoding="utf-8"))
            diff = sorted(k for k in set(old) | set(manifest) if old.get(k) != manifest.get(k))
            if diff:
                raise RunMismatch(
                    f"{self.dir}: holds a run made with other settings ({', '.join(diff)} "
                    f"differ); rerun with the same settings to continue it, or use a new --out")
        else:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(manifest, ensure_ascii=False, indent=1), encoding="utf-8")
            os.replace(tmp, path)
        self.manifest = manifest

    def _load(self) -> None:
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        good: list[bytes] = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                if i == len(lines) - 1:     # a write cut short by a kill: redo that case
                    self.torn_lines += 1
                    continue
                raise ValueError(f"{self.path}:{i + 1}: not a JSON line; the run file is "
                                 "damaged (only its last line may be cut off)") from None
            if rec["id"] in self.records:
                raise ValueError(f"{self.path}:{i + 1}: case {rec['id']!r} appears twice")
            self.records[rec["id"]] = rec
            good.append(line)
        if self.torn_lines:
            self.path.write_bytes(b"".join(x + b"\n" for x in good))

    def done(self, case_id: str) -> bool:
        return case_id in self.records

    def append(self, record: dict) -> None:
        if record["id"] in self.records:
            raise ValueError(f"case {record['id']!r} is already recorded in {self.path}")
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.records[record["id"]] = record
