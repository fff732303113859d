"""Where and how a command writes: the one rule every `peer-rl` command that writes follows.

A command never writes into or over its own inputs (its output is not an input, does not lie
inside an input directory, and holds no input); it never replaces a directory or file it did not
create; and `--force` replaces only what it wrote before. What a command wrote is known by its
marker: a directory it owns holds MARKER naming the command, and a file it wrote is listed in
the MARKER of the file's directory. A command that continues its own run on a rerun (training
with resume=auto, the evaluations, the data jobs, a chain) claims its directory with
`resume=True` instead of `--force`.

Files that a resume, a chain or a later stage reads are written by `write_atomic` (beside, fsync,
rename) and read back by `read_json`, whose error names a damaged file. Append-only logs are read
by `read_jsonl`, which drops a torn last line (a crash mid-append) and names a damaged one
elsewhere. `lock_dir` holds a directory for one process at a time.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from peer_rl.errors import ConfigError

MARKER = ".peer-rl-out.json"
LOCK_FILE = ".lock"
_OWN = (MARKER, LOCK_FILE)          # what a directory may hold and still count as empty


class OutputError(ConfigError):
    """An output that would destroy or mix data: names the path and the way on."""


class DamagedFile(ConfigError):
    """A file a later stage reads that does not parse (a write cut short, or edited by hand)."""


class DirLocked(OutputError):
    """Another process is writing the directory."""


# ------------------------------------------------------------------------- inputs
def _inside(child: Path, parent: Path) -> bool:
    child, parent = child.resolve(), parent.resolve()
    return child == parent or parent in child.parents


def refuse_inside(out: str | Path, inputs, flag: str = "--out") -> None:
    """`out` may not be one of the inputs (files or directories), lie inside an input
    directory, or hold an input (a directory output replaced whole would take it along)."""
    out = Path(out)
    for root in (Path(p) for p in inputs if p):
        if out.resolve() == root.resolve():
            where = "is the input"
        elif not root.is_file() and _inside(out, root):
            where = "is inside the input"
        elif _inside(root, out):
            where = "holds the input"
        else:
            continue
        raise OutputError(f"{flag} {out}: {where} {root}; write to a path outside it (the "
                          "input stays as it is)")


# ------------------------------------------------------------------------- markers
def read_marker(directory: str | Path) -> dict:
    path = Path(directory) / MARKER
    if not path.is_file():
        return {}
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return {}                       # unreadable: claims nothing
    return found if isinstance(found, dict) else {}


def mark_dir(directory: str | Path, command: str) -> None:
    """`directory` is `command`'s output (its files may be replaced by `command --force`)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / MARKER, json.dumps(read_marker(d) | {"command": command}, indent=1))


def _mark_file(path: Path, command: str) -> None:
    marker = read_marker(path.parent)
    files = dict(marker.get("files") or {}) | {path.name: command}
    write_atomic(path.parent / MARKER, json.dumps(marker | {"files": files}, indent=1))


def _foreign(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in _OWN)


# ------------------------------------------------------------------------- claims
def claim_dir(out: str | Path, command: str, inputs=(), force: bool = False,
              resume: bool = False, create: bool = True, flag: str = "--out",
              run_state: str = "") -> Path:
    """`out` as `command`'s output directory, refused (OutputError, nothing written) when it is
    an input or holds one, is a file, or holds anything `command` did not write; an earlier
    output of `command` only with `force` (replaced) or `resume` (continued). `create`: make it
    and mark it now (False: the caller writes it elsewhere and renames it in, marked with
    `mark_dir`). `run_state`: with `resume`, the run file (relative to `out`) by which a run
    `command` began before it left markers is recognised and continued."""
    out = Path(out)
    refuse_inside(out, inputs, flag)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{flag} {out}: exists and is not a directory; choose a new directory")
    found = _foreign(out) if out.is_dir() else []
    if found:
        owner = read_marker(out).get("command")
        if owner is None and resume and run_state and (out / run_state).is_file():
            owner = command
        listed = ", ".join(found[:3]) + (" ..." if len(found) > 3 else "")
        if owner != command:
            by = f"the output of `peer-rl {owner}`" if owner else \
                f"files `peer-rl {command}` did not write ({listed})"
            raise OutputError(f"{flag} {out}: holds {by}; it is left as it is: choose a new "
                              "or empty directory")
        if not (force or resume):
            raise OutputError(f"{flag} {out}: holds an earlier `peer-rl {command}` output "
                              f"({listed}); pass --force to replace it, or choose a new "
                              "directory")
    if create:
        mark_dir(out, command)
    return out


def claim_file(out: str | Path, command: str, inputs=(), force: bool = False,
               flag: str = "--out") -> Path:
    """`out` as a file `command` writes: not an input nor inside an input directory; an
    existing file only with `force` and only if `command` wrote it (its directory's MARKER
    says so). Records the claim, creating the directory."""
    out = Path(out)
    refuse_inside(out, inputs, flag)
    if out.is_dir():
        raise OutputError(f"{flag} {out}: is a directory; expected a file path")
    if out.exists():
        owner = (read_marker(out.parent).get("files") or {}).get(out.name)
        if owner != command:
            raise OutputError(f"{flag} {out}: exists and was not written by `peer-rl "
                              f"{command}`; it is left as it is: choose another path")
        if not force:
            raise OutputError(f"{flag} {out}: exists (an earlier `peer-rl {command}` output); "
                              "pass --force to replace it, or choose another path")
    out.parent.mkdir(parents=True, exist_ok=True)
    _mark_file(out, command)
    return out


def claim_files(root: str | Path, rels, command: str, inputs=(), force: bool = False,
                flag: str = "--out") -> list[Path]:
    """Files `rels` (relative to `root`) that `command` adds to `root`, a directory it may not
    own (e.g. `import-esconv` into a data root, beside its input file if so): each claimed as
    by claim_file; `root` itself may not be an input file."""
    if any(Path(root).resolve() == Path(p).resolve() for p in inputs if p):
        raise OutputError(f"{flag} {root}: is the input; write to a directory")
    if Path(root).exists() and not Path(root).is_dir():
        raise OutputError(f"{flag} {root}: exists and is not a directory")
    return [claim_file(Path(root) / r, command, inputs, force, flag) for r in rels]


def claim_run_dir(out: str | Path, command: str, inputs=()):
    """A training run's output directory (trainer.output_dir): claimed as `command`'s (its own
    earlier output may be written over: the caller has refused to replace a run there), and
    locked for this process, so a second run on it is refused naming the first's pid. Returns
    the lock, held until it is closed or the process ends."""
    claim_dir(out, command, inputs, force=True, flag="trainer.output_dir")
    return lock_dir(out, f"{command} run")


def release_unwritten(out: str | Path) -> None:
    """Remove a directory this process claimed (it did not exist before) when it still holds
    nothing but the marker and the lock: a run refused before writing leaves nothing behind."""
    import shutil

    d = Path(out)
    if d.is_dir() and {p.name for p in d.iterdir()} <= {MARKER, LOCK_FILE}:
        shutil.rmtree(d)


def plain_name(name: str, what: str) -> str:
    """A file or directory name from the command line: one path component, no climbing."""
    if not name or name in (".", "..") or any(c in name for c in "/\\") or "\0" in name:
        raise OutputError(f"{what}={name!r}: expected a plain file name (no '/', '\\', '..')")
    return name


# ------------------------------------------------------------------------- one process
def lock_dir(directory: str | Path, what: str = "directory"):
    """An exclusive flock on <directory>/.lock holding this process's pid, released when the
    returned file is closed or the process ends (a kill included). A second process is
    refused (DirLocked) naming the holder's pid."""
    import fcntl

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    fh = open(d / LOCK_FILE, "a+", encoding="utf-8")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "?"
        fh.close()
        raise DirLocked(f"{d}: in use by another process (pid {holder}) writing this {what}; "
                        "wait for it to finish or stop it, then rerun") from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()))
    fh.flush()
    return fh


# ------------------------------------------------------------------------- files read later
def write_atomic(path: str | Path, data: str | bytes, mode: int | None = None) -> Path:
    """`data` into `path` whole or not at all: written beside, fsynced, renamed in, the
    directory fsynced. `mode`: the new file's permissions (e.g. 0o600)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return write_whole(path, lambda fh: fh.write(raw), mode)


def write_whole(path: str | Path, fill, mode: int | None = None) -> Path:
    """`fill(binary file)` writes `path`'s content beside it; then fsync, rename in, fsync the
    directory. A failure (a full disk, a signal) leaves no half file beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode)
    try:
        with open(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    from peer_rl.runtime import fsync_dir

    fsync_dir(path.parent)
    return path


def read_json(path: str | Path, what: str = ""):
    """A JSON file a later stage reads; DamagedFile naming it when it does not parse."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise DamagedFile(f"{path}: damaged{' ' + what if what else ''} (not JSON: {exc}); "
                          "rerun the command that writes it") from None


def read_jsonl(path: str | Path) -> tuple[list[dict], int, bool]:
    """The records of an append-only log; (records, torn, needs_repair): a last line that does
    not parse (a crash mid-append) is dropped (torn: its line number, else 0), and a file not
    ending in a newline needs its tail rewritten before the next append. A bad line elsewhere:
    DamagedFile naming it."""
    path = Path(path)
    if not path.exists():
        return [], 0, False
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records, torn = [], 0
    last = max((i for i, x in enumerate(lines) if x.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except (ValueError, UnicodeDecodeError):
            if i == last:
                torn = i + 1
                continue
            raise DamagedFile(f"{path}:{i + 1}: not a JSON record (expected one object per "
                              "line; only the last line may be cut off); move the file aside "
                              "to go on without it") from None
    return records, torn, bool(torn) or (bool(raw) and not raw.endswith(b"\n"))


def rewrite_jsonl(path: str | Path, records: list[dict], mode: int | None = None) -> None:
    write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), mode)


def repair_jsonl(path: str | Path, last_step: int | None = None, mode: int | None = None
                 ) -> tuple[list[dict], int]:
    """Open an append-only log for more appends: a torn tail dropped, a missing final newline
    restored, records past `last_step` (a resume redoes them) dropped; rewritten atomically
    only when something changed. Returns (the records kept, the torn line dropped or 0)."""
    records, torn, repair = read_jsonl(path)
    kept = [r for r in records if last_step is None or r.get("step", 0) <= last_step]
    if repair or len(kept) != len(records):
        rewrite_jsonl(path, kept, mode)
    return kept, torn
