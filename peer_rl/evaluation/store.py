"""A run directory that survives being killed: one JSON line per finished case.

A case is appended (flushed and fsynced) only once every one of its turns and scores exist, so
a rerun on the same directory skips exactly the cases on file and redoes the rest: none lost,
none counted twice. A line cut off by a kill is dropped on reopen (and reported; the file is
rewritten beside and renamed, so a crash during the repair loses nothing). The manifest pins
what the cases were produced with; a rerun with different protocol settings or parties is
refused instead of mixing two evaluations in one file. A store holds an exclusive lock on its
directory while open: a second process on the same --out (a rerun while a killed run's orphan
still works) is refused, naming the holder, instead of both appending.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from peer_rl.files.out_paths import DirLocked, lock_dir, open_append, read_json, write_atomic

CASES_FILE = "cases.jsonl"
MANIFEST_FILE = "run.json"


class RunMismatch(ValueError):
    pass


RunLocked = DirLocked          # another process has the run directory open


class RunStore:
    def __init__(self, out_dir: str | Path, manifest: dict):
        self.dir = Path(out_dir)
        if self.dir.exists() and not self.dir.is_dir():
            raise RunMismatch(f"{self.dir}: exists and is not a directory; --out names the run "
                              "directory")
        if not self.dir.exists():     # dialogues of a sensitive kind: the user's eyes only
            self.dir.mkdir(parents=True, mode=0o700)
            os.chmod(self.dir, 0o700)
        self._lock = lock_dir(self.dir, "run")
        self.path = self.dir / CASES_FILE
        self.torn_lines = 0
        self.records: dict[str, dict] = {}
        try:
            self._check_manifest(manifest)
            self._load()
        except BaseException:
            self.close()
            raise

    def _check_manifest(self, manifest: dict) -> None:
        path = self.dir / MANIFEST_FILE
        if path.exists():
            old = read_json(path, "run manifest")
            diff = sorted(k for k in set(old) | set(manifest) if old.get(k) != manifest.get(k))
            if diff:
                raise RunMismatch(
                    f"{self.dir}: holds a run made with other settings ({', '.join(diff)} "
                    f"differ); rerun with the same settings to continue it, or use a new --out")
        else:
            write_atomic(path, json.dumps(manifest, ensure_ascii=False, indent=1))
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
        # a torn line dropped, or a last record without its newline (the next append would be
        # glued to it): the file is rewritten beside and renamed in
        if self.torn_lines or not raw.endswith(b"\n"):
            write_atomic(self.path, b"".join(x + b"\n" for x in good), mode=0o600)

    def close(self) -> None:
        """Release the directory's lock (the process's end releases it too)."""
        if self._lock is not None and not self._lock.closed:
            self._lock.close()

    def __del__(self):
        lock = getattr(self, "_lock", None)
        if lock is not None and not lock.closed:
            lock.close()

    def done(self, case_id: str) -> bool:
        return case_id in self.records

    def append(self, record: dict) -> None:
        if record["id"] in self.records:
            raise ValueError(f"case {record['id']!r} is already recorded in {self.path}")
        with open_append(self.path, 0o600) as fh:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.records[record["id"]] = record
