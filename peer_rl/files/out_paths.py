"""Where and how a command writes: the one rule every `peer-rl` command that writes follows.

A command never writes into or over its own inputs (its output is not an input, does not lie
inside an input directory, and holds no input); it never replaces a directory or file it did not
create; and `--force` replaces only what it wrote before. What a command wrote is known by its
marker: a directory it owns holds MARKER naming the command, and a file it wrote is listed in
the MARKER of the file's directory. A command that continues its own run on a rerun (training
with resume=auto, the evaluations, the data jobs, a chain) claims its directory with
`resume=True` instead of `--force`.

How a file is opened for writing, everywhere: never through a link peer-rl did not make, never
a name it did not create, never removing a path it cannot show it wrote. A new file or directory
is made under a unique name beside its target (`O_CREAT | O_EXCL | O_NOFOLLOW`: `new_file`,
`new_dir`) and renamed in (`write_whole`, `write_atomic`; a directory: `staged_dir`); an
append-only log is opened without following a link (`open_append`); a file is set aside under a
name no other file holds (`move_aside`); the `.lock` of `lock_dir` is made by it or refused; and
what `staged_dir` drops of an earlier output is only what that output's marker says the command
wrote: anything else found in it is carried into the new one.

Files that a resume, a chain or a later stage reads are written whole (beside, fsync, rename)
and read back by `read_json`, whose error names a damaged file. Append-only logs are read
by `read_jsonl`, which drops a torn last line (a crash mid-append) and names a damaged one
elsewhere. `lock_dir` holds a directory for one process at a time; a directory's marker is
updated under a lock of its own, so processes claiming files in one directory lose no claim.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path

from peer_rl.errors import ConfigError
from peer_rl.files.durable import fsync_dir

log = logging.getLogger(__name__)

MARKER = ".peer-rl-out.json"
LOCK_FILE = ".lock"


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


@contextmanager
def _marker_held(directory: Path):
    """The directory's marker for one read-modify-write at a time: an flock on the directory
    itself (no file is made for it). Where the file system cannot lock a directory (some NFS
    mounts) the update goes on unlocked, as it did before this lock existed."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)                    # releases the flock


def mark_dir(directory: str | Path, command: str, wrote: list[str] | None = None) -> None:
    """`directory` is `command`'s output (its files may be replaced by `command --force`).
    `wrote`: the names `command` put there (a directory `staged_dir` swaps in: what a later
    replacement may drop)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    with _marker_held(d):
        old = read_marker(d)
        found = old | {"command": command}
        if wrote is not None:
            found["wrote"] = sorted(wrote)
        if found != old or not (d / MARKER).is_file() or (d / MARKER).is_symlink():
            write_atomic(d / MARKER, json.dumps(found, indent=1))


def _foreign(directory: Path) -> list[str]:
    """What `directory` holds besides its marker (and the `.lock` beside a marker: a lone
    `.lock` is someone else's file, not ours)."""
    names = {p.name for p in directory.iterdir()}
    own = {MARKER, LOCK_FILE} if MARKER in names else set()
    return sorted(names - own)


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
    says so). Records the claim, creating the directory; the check and the record are one step
    under the marker's lock, so claims from several processes in one directory all land."""
    out = Path(out)
    refuse_inside(out, inputs, flag)
    if out.is_dir():
        raise OutputError(f"{flag} {out}: is a directory; expected a file path")
    out.parent.mkdir(parents=True, exist_ok=True)
    with _marker_held(out.parent):
        marker = read_marker(out.parent)
        files = dict(marker.get("files") or {})
        if out.exists() or out.is_symlink():
            if files.get(out.name) != command:
                raise OutputError(f"{flag} {out}: exists and was not written by `peer-rl "
                                  f"{command}`; it is left as it is: choose another path")
            if not force:
                raise OutputError(f"{flag} {out}: exists (an earlier `peer-rl {command}` "
                                  "output); pass --force to replace it, or choose another path")
        if files.get(out.name) != command:
            files[out.name] = command
            write_atomic(out.parent / MARKER, json.dumps(marker | {"files": files}, indent=1))
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
    nothing but the marker and the lock: a run refused before writing leaves nothing behind.
    Only those two names are removed; the directory goes only once it is empty."""
    d = Path(out)
    if not d.is_dir() or d.is_symlink() or {p.name for p in d.iterdir()} - {MARKER, LOCK_FILE}:
        return
    for name in (MARKER, LOCK_FILE):
        (d / name).unlink(missing_ok=True)
    try:
        d.rmdir()
    except OSError:                     # something arrived meanwhile: it stays
        pass


def plain_name(name: str, what: str) -> str:
    """A file or directory name from the command line: one path component, no climbing."""
    if not name or name in (".", "..") or any(c in name for c in "/\\") or "\0" in name:
        raise OutputError(f"{what}={name!r}: expected a plain file name (no '/', '\\', '..')")
    return name


# ------------------------------------------------------------------------- one process
def _is_our_lock(fd: int) -> bool:
    """A `.lock` that `lock_dir` made: a plain file with one name, holding a pid or nothing."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > 32:
        return False
    return os.pread(fd, 33, 0).strip().isdigit() or st.st_size == 0


def lock_dir(directory: str | Path, what: str = "directory"):
    """An exclusive flock on <directory>/.lock holding this process's pid, released when the
    returned file is closed or the process ends (a kill included). A second process is
    refused (DirLocked) naming the holder's pid. The `.lock` is made here, or is one made
    here before (a plain file holding a pid); a link or any other file of that name is
    refused (OutputError) and left as it is."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / LOCK_FILE
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        try:
            fd = os.open(path, flags)
        except OSError as exc:          # ELOOP: a link; ENXIO, EACCES, ...: not ours either
            raise OutputError(f"{path}: not a lock peer-rl made ({os.strerror(exc.errno)}); "
                              "it is left as it is: remove it or choose another "
                              "directory") from None
        if not _is_our_lock(fd):
            os.close(fd)
            raise OutputError(f"{path}: not a lock peer-rl made (a link, a directory or a file "
                              "holding more than a pid); it is left as it is: remove it or "
                              "choose another directory")
    fh = open(fd, "r+", encoding="utf-8")
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


# ------------------------------------------------------------------------- new names
def _unique(directory: Path, name: str, suffix: str, make):
    """`make(path)` on `.<name>.<random><suffix>` in `directory` until it creates a new one
    (it must fail with FileExistsError on a name that exists). Not tempfile.mkstemp/mkdtemp:
    they make 0600/0700 entries, and a written file must keep the umask's permissions, as the
    file it replaces would (fixing them afterwards means reading the umask, which is racy)."""
    stem = name[:180]                   # room for the rest within a file name's 255 bytes
    for _ in range(100):
        path = directory / f".{stem}.{secrets.token_hex(4)}{suffix}"
        try:
            return make(path), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no unused name for .{stem}.*{suffix}", str(directory))


def new_file(directory: str | Path, name: str, suffix: str = ".tmp", mode: int = 0o666
             ) -> tuple[int, Path]:
    """(fd, path) of a file made now beside `name` in `directory` (O_EXCL | O_NOFOLLOW: never
    one that existed, never through a link); `mode` before the umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return _unique(Path(directory), name, suffix, lambda p: os.open(p, flags, mode))


def new_dir(directory: str | Path, name: str, suffix: str = ".tmp") -> Path:
    """A directory made now beside `name` in `directory` (`staged_dir`'s, or scratch space
    removed after); its permissions are the umask's, as any new directory's."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    return _unique(d, name, suffix, lambda p: os.mkdir(p, 0o777))[1]


def open_append(path: str | Path, mode: int = 0o666, binary: bool = False):
    """An append-only log opened for appending, made if absent: never through a link
    (O_NOFOLLOW), and only a plain file (a FIFO or device is refused, not written)."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise OutputError(f"{path}: is a link; peer-rl appends only to a file it made there "
                          "(it is left as it is: remove the link to go on)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OutputError(f"{path}: not a plain file; it is left as it is: remove it to go on")
    os.set_blocking(fd, True)
    return open(fd, "ab") if binary else open(fd, "a", encoding="utf-8")


def move_aside(path: str | Path, suffix: str) -> Path:
    """`path` renamed to `<name><suffix>`, or `<name><suffix>.1`, `.2`, ... : never over a
    file that is there already (an earlier copy set aside stays)."""
    path = Path(path)
    for k in range(1000):
        aside = path.with_name(path.name + suffix + (f".{k}" if k else ""))
        try:
            os.link(path, aside, follow_symlinks=False)   # fails if `aside` exists
        except FileExistsError:
            continue
        except OSError:                 # no hard links here: the name checked, then renamed
            if aside.exists() or aside.is_symlink():
                continue
            os.rename(path, aside)
            return aside
        os.unlink(path)
        return aside
    raise FileExistsError(errno.EEXIST, f"no free name for {path.name}{suffix}", str(path))


# ------------------------------------------------------------------------- files read later
def write_atomic(path: str | Path, data: str | bytes, mode: int | None = None) -> Path:
    """`data` into `path` whole or not at all: written beside, fsynced, renamed in, the
    directory fsynced. `mode`: the new file's permissions (e.g. 0o600)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return write_whole(path, lambda fh: fh.write(raw), mode)


def write_whole(path: str | Path, fill, mode: int | None = None) -> Path:
    """`fill(binary file)` writes `path`'s content into a file made now beside it (`new_file`);
    then fsync, rename in, fsync the directory. A link at `path` is replaced, its target never
    written. A failure (a full disk, a signal) leaves no half file beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_file(path.parent, path.name, mode=0o666 if mode is None else mode)
    try:
        with open(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

    fsync_dir(path.parent)
    return path


def copy_file(src: str | Path, dst: str | Path) -> Path:
    """`src`'s bytes and times into `dst`, written whole as `write_whole` writes."""
    with open(src, "rb") as fh_in:
        write_whole(dst, lambda fh: shutil.copyfileobj(fh_in, fh, 1 << 20))
    shutil.copystat(src, dst, follow_symlinks=False)
    return Path(dst)


def save_figure(fig, path: str | Path, dpi: int = 100) -> Path:
    """A matplotlib figure as a PNG, written whole as `write_whole` writes."""
    return write_whole(path, lambda fh: fig.savefig(fh, format="png", dpi=dpi))


@contextmanager
def staged_dir(target: str | Path, exists: str = "replace", *, command: str = "",
               refused: str = "it is never written over", complete=None, durable: bool = True):
    """`with staged_dir(target) as tmp:` the body writes `target`'s content into `tmp`, a
    directory made now beside it (`new_dir`); on a clean exit `tmp` is fsynced and renamed in,
    so a reader meets the old whole or the new whole, never half of either. A failure before
    it is in (the body's, the fsync's, a refused swap) removes `tmp`, all of it made here, and
    leaves `target` as it was.

    `exists`, what a `target` already there gets:
      "replace": swapped out as `_replace_dir` says (`command` marks the new one as its output;
                 files of the old one it did not write are carried over);
      "refuse":  never written over (a checkpoint): OutputError "<target>: exists; `refused`",
                 and the finished `tmp` is kept beside it, named in the error;
      "keep":    a copy another process finished first, when `complete(target)` says so, stays
                 and ours is dropped (a cache filled by two processes at once); else the
                 rename's error.
    `durable=False`: no fsync (a directory read at once by this process and gone with it)."""
    from peer_rl.files.durable import fsync_dir, fsync_tree  # deferred: tests patch fsync_tree

    if exists not in ("replace", "refuse", "keep"):
        raise ValueError(f"exists={exists!r}: expected replace, refuse or keep")
    target = Path(target)
    staged = new_dir(target.parent, target.name)
    kept = False
    try:
        yield staged
        if exists == "replace":
            _replace_dir(staged, target, command, durable)
            return
        if durable:
            fsync_tree(staged)           # on disk before its name says it is complete
        try:
            os.rename(staged, target)    # onto an empty directory at most (nothing lost)
        except OSError:
            if exists == "refuse":
                kept = True              # finished: left beside it for the user
                raise OutputError(f"{target}: exists; {refused} (this one is left in "
                                  f"{staged.name})") from None
            if not complete(target):
                raise
            shutil.rmtree(staged)        # another process's whole copy stays
            return
        if durable:
            fsync_dir(target.parent)
    except BaseException:
        if not kept and staged.is_dir() and not staged.is_symlink():
            shutil.rmtree(staged)        # made here, never swapped in
        raise


def _replace_dir(staging: Path, out: Path, command: str, durable: bool) -> None:
    """`staging` becomes `out`. `command`: the staging directory is marked as its output,
    naming what it wrote. Of an earlier `out` only the names its marker lists as written (or,
    where it lists none, the names the new one writes) are dropped; anything else in it (a
    user's notes) is carried into the new `out`, and back into the old one if the swap fails.
    An earlier `out` marked by another command, a file or a link is refused."""
    from peer_rl.files.durable import fsync_dir, fsync_tree  # deferred: tests patch fsync_tree

    wrote = [p.name for p in staging.iterdir() if p.name != MARKER]
    if command:
        mark_dir(staging, command, wrote)
    if durable:
        fsync_tree(staging)              # on disk before it replaces the old one
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise OutputError(f"{out}: exists and is not a directory; it is left as it is")
    if not out.exists():
        os.rename(staging, out)          # a directory made meanwhile: refused unless empty
        if durable:
            fsync_dir(out.parent)
        return
    old = read_marker(out)
    if command and old.get("command", command) != command:
        raise OutputError(f"{out}: holds the output of `peer-rl {old['command']}`; it is left "
                          "as it is")
    ours = set(old["wrote"]) if isinstance(old.get("wrote"), list) else set(wrote)
    ours.add(MARKER)
    aside = _swap_carrying(staging, out, ours)
    if durable:
        fsync_dir(out.parent)
    left = sorted(p.name for p in (aside / out.name).iterdir() if p.name not in ours)
    if left:                             # a name of ours the user also used: kept, said

        log.warning(f"{aside / out.name}: kept (holds {', '.join(left[:3])}, not written "
                    f"by peer-rl, under names the new {out.name} also has)")
        return
    shutil.rmtree(aside)


def _swap_carrying(staging: Path, out: Path, ours: set[str]) -> Path:
    """`staging` in place of `out`, with what `out` holds under names not in `ours` carried
    over; the old `out` is set aside in a directory made now, which is returned. A failure puts
    the old `out` and the carried names back as they were."""
    carried = []
    try:
        for p in sorted(out.iterdir()):  # not ours: carried into the new output
            if p.name not in ours and not os.path.lexists(staging / p.name):
                os.rename(p, staging / p.name)
                carried.append(p.name)
        aside = new_dir(out.parent, out.name, ".old")
        os.rename(out, aside / out.name)
        try:
            os.rename(staging, out)
        except BaseException:
            os.rename(aside / out.name, out)  # the old one back in place
            aside.rmdir()
            raise
    except BaseException:
        for name in carried:
            os.rename(staging / name, out / name)
        raise
    return aside


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
