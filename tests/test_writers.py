"""Every `peer-rl` subcommand that writes, held against the same hostile layouts: an output
that is an input directory, inside one (or holding the input file), an input file, a directory
or file the command did not write (refused even with --force), and the command's own earlier
output (let through: with --force, or continued where a rerun resumes).

Then the layouts a user's own files make around and inside that earlier output (issue 58): a
directory holding only a `.lock` that links to a file of theirs, their `.lock` link inside the
command's output, links planted at the temporary names a write used to take (`X.tmp`, the
marker's `.tmp`), their copies `OUT.old` / `OUT.new` beside it, a file of theirs inside it, and
`--dry-run`. Whatever the command does, the linked file's bytes, the links, the copies and the
file inside stay as they were; a dry run changes nothing at all.

A refusal is exit 2 with one line naming the output, and nothing under the inputs or the other
directories changes (every file's bytes compared before and after). Where what follows the
check is heavy (Ray, vLLM, an endpoint), the test replaces that next step by one that raises
`Reached`: what is tested is that the output check lets the command through to its work. Where
the command's own last step is what a layout tests (`index build` swapping its index in, the
model builds swapping their directory in), a stand-in does the rest and the real last step runs.
"""
import argparse
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from peer_rl.cli import main, parser
from peer_rl.data.bundled import copy_sample

MARKER = ".peer-rl-out.json"          # spelled out here: the format is part of the contract
PARTIES = ["model.url=http://127.0.0.1:9/v1", "seeker.url=http://127.0.0.1:9/v1",
           "judge.url=http://127.0.0.1:9/v1"]
JOB_PARTIES = [f"{r}.url=http://127.0.0.1:9/v1" for r in
               ("judge", "writer", "client", "counselor", "teacher")]


class Reached(Exception):
    """The command got past its output check to its work."""


class _Encoder:
    """A stand-in embedding model: a fixed vector per text (index build runs for real)."""

    def encode(self, texts):
        return np.stack([np.random.default_rng(len(t)).normal(size=8) for t in texts])


def _encoder(*a, **k):
    return _Encoder()


def _fake_build(built_by: str):
    """A model build trained in no time: one model directory, then the real swap_in."""
    def build(out_dir, *a, **k):
        from peer_rl.trainer.tiny_cache import swap_in

        with tempfile.TemporaryDirectory() as tmp:
            staging = Path(tmp) / "out"
            (staging / "judge").mkdir(parents=True)
            (staging / "judge" / "config.json").write_text("{}")
            swap_in(staging, Path(out_dir).resolve(), {"models": {"judge": {}}}, built_by)
        return Path(out_dir)
    return build


@dataclass(frozen=True)
class Cmd:
    name: str            # the subcommand as a user types it (the marker's command)
    argv: object         # (out, world) -> argument list
    input: str           # "root" (the data root), a path relative to the world, or "" (none)
    output: str = "dir"  # dir: a directory the command owns; file: one file it writes
    force: bool = True   # the command has --force (else a rerun continues its own output)
    work: str = ""       # "module:attr" replaced by Reached (empty: the command runs for real)
    owner: str = ""      # the marker's command when it is not `name` (a stage's front door)
    stand_in: object = None   # what replaces `work` instead of Reached (the rest runs for real)
    locks: bool = False  # holds <out>/.lock before `work` (a planted .lock link is refused)
    dry_run: bool = False     # has --dry-run


def _grpo_input(w):
    return w / "root" / "grpo" / "textual.jsonl"


COMMANDS = [
    Cmd("data sample", lambda o, w: ["data", "sample", "--out", o], ""),
    Cmd("data to-verl", lambda o, w: ["data", "to-verl", str(w / "root"), "--out", o], "root",
        work="peer_rl.data.verl_export:export_verl"),
    Cmd("data import-esconv", lambda o, w: ["data", "import-esconv", str(w / "esconv.json"),
                                            "--out", o], "esconv.json", output="root"),
    Cmd("data rounds", lambda o, w: ["data", "rounds", str(w / "root"), "--out", o], "root"),
    Cmd("data holdout", lambda o, w: ["data", "holdout", str(w / "root"), "--out", o], "root"),
    Cmd("data filter", lambda o, w: ["data", "filter", str(w / "root"), "--out", o,
                                     *JOB_PARTIES], "root", force=False,
        work="peer_rl.datajobs.job:run_job"),
    Cmd("data personas", lambda o, w: ["data", "personas", str(w / "root"), "--out", o,
                                       *JOB_PARTIES], "root", force=False,
        work="peer_rl.datajobs.job:run_job", locks=True),
    Cmd("data rewrite", lambda o, w: ["data", "rewrite", str(w / "root"), "--personas",
                                      str(w / "personas"), "--out", o, *JOB_PARTIES], "root",
        force=False, work="peer_rl.datajobs.rewrite:load_personas"),
    Cmd("data preference", lambda o, w: ["data", "preference", "--out", o,
                                         f"preference.seeds={w / 'cards.json'}", *JOB_PARTIES],
        "cards.json", force=False, work="peer_rl.datajobs.job:run_job"),
    Cmd("data cold-start", lambda o, w: ["data", "cold-start", str(w / "root"), "--out", o,
                                         *JOB_PARTIES], "root", force=False,
        work="peer_rl.datajobs.cold_start:pass_two_index"),
    Cmd("judge-template fit", lambda o, w: ["judge-template", "fit", str(w / "root"),
                                            "--out", o], "root", output="file"),
    Cmd("index build", lambda o, w: ["index", "build", str(w / "root"), "--out", o], "root",
        work="peer_rl.models.encoders:load_embedding_model", stand_in=_encoder),
    Cmd("models build-tiny", lambda o, w: ["models", "build-tiny", "--out", o], "",
        work="peer_rl.trainer.tiny_cache:build_shipped_tiny_models",
        stand_in=_fake_build("models build-tiny")),
    Cmd("models build-smollm2", lambda o, w: ["models", "build-smollm2", "--out", o], "",
        work="peer_rl.trainer.shipped_adapters:build_shipped_adapters",
        stand_in=_fake_build("models build-smollm2")),
    Cmd("models use-smollm2", lambda o, w: ["models", "use-smollm2", "judge", "--out", o,
                                            f"data.root={w / 'root'}",
                                            f"model.path={w / 'model'}"], "root", force=False,
        work="peer_rl.trainer.shipped_adapters:config_inputs", owner="train-rm"),
    Cmd("plot", lambda o, w: ["plot", str(w / "run"), "--out", o], "run",
        work="peer_rl.trainer.figures:draw_figures"),
    Cmd("eval rm", lambda o, w: ["eval", "rm", "--data", str(w / "root"), "--model",
                                 str(w / "model"), "--out", o], "root", output="file",
        work="peer_rl.evaluation.rm:evaluate_rm"),
    Cmd("eval pairs", lambda o, w: ["eval", "pairs", "--data", str(w / "root"), "--model",
                                    str(w / "model"), "--out", o], "root", output="file",
        work="peer_rl.evaluation.pairs:evaluate_pairs"),
    Cmd("eval esc", lambda o, w: ["eval", "esc", "--out", o, f"esc.cards={w / 'cards.json'}",
                                  *PARTIES], "cards.json", force=False,
        work="peer_rl.evaluation.run:open_parties", locks=True),
    Cmd("eval sage", lambda o, w: ["eval", "sage", "--out", o,
                                   f"sage.profiles={w / 'profiles.jsonl'}", *PARTIES],
        "profiles.jsonl", force=False, work="peer_rl.evaluation.run:open_parties", locks=True),
    Cmd("eval safety", lambda o, w: ["eval", "safety", "--out", o, f"safety.root={w / 'root'}",
                                     *PARTIES], "root", force=False,
        work="peer_rl.evaluation.run:open_parties", locks=True),
    Cmd("eval diversity", lambda o, w: ["eval", "diversity", "--out", o,
                                        f"diversity.root={w / 'root'}", *PARTIES], "root",
        force=False, work="peer_rl.evaluation.run:open_parties", locks=True),
    Cmd("eval ccj", lambda o, w: ["eval", "ccj", "--out", o, f"ccj.root={w / 'root'}",
                                  *PARTIES], "root", force=False,
        work="peer_rl.evaluation.run:open_parties", locks=True),
    Cmd("eval ladder", lambda o, w: ["eval", "ladder", "escrag_ablation", "--out", o], "",
        force=False, work="peer_rl.evaluation.ladder:run_ladder"),
    Cmd("eval compare", lambda o, w: ["eval", "compare", str(w / "root"), "--out", o], "root",
        work="peer_rl.evaluation.report:compare_runs"),
    Cmd("bench trl", lambda o, w: ["bench", "trl", "--peer-only", "--json", o], "",
        output="file", work="peer_rl.bench.trl:_model"),
    Cmd("chain", lambda o, w: ["chain", str(w / "chain.yaml"), f"out={o}"], "", force=False,
        locks=True, dry_run=True),
    Cmd("train", lambda o, w: ["train", f"trainer.output_dir={o}", f"data.root={w / 'root'}"],
        "root", force=False, work="peer_rl.trainer.run:load_prompts", locks=True),
    Cmd("sft", lambda o, w: ["sft", f"trainer.output_dir={o}", f"data.root={w / 'root'}"],
        "root", force=False, work="peer_rl.trainer.supervised_run:plan_stage", locks=True),
    Cmd("train-rm", lambda o, w: ["train-rm", f"trainer.output_dir={o}",
                                  f"data.root={w / 'root'}"], "root", force=False,
        work="peer_rl.trainer.supervised_run:plan_stage", locks=True),
]
# write nothing, or only the pinned-model cache (never a path from the command line); of the
# benchmarks (their own parsers), `bench trl --json FILE` writes and is in the table
NOT_WRITERS = {"data check", "data stats", "judge-template check", "index query", "chat",
               "bench", "models list", "models fetch", "plan"}   # plan only prints
LAYOUTS = ("out_is_input", "out_inside_input", "out_is_input_file", "not_its_own",
           "its_own_earlier_output")
# issue 58: a user's files around and inside the command's own earlier output
PLANTS = ("lock_alone", "lock_link_in_own", "tmp_links", "old_new_beside", "extra_in_own",
          "dry_run")
VICTIM_TEXT = "the user's own words, not peer-rl's\n"


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    """The sample data root, taken once from the shipped copy and copied into each test's world."""
    root = tmp_path_factory.mktemp("sample") / "root"
    copy_sample(root)     # build_sample's output: tests/data/test_sample_stats_import.py
    return root


def _world(tmp: Path, sample: Path) -> Path:
    """A data root and the other files the commands read, plus a directory of someone else's
    and a file of theirs (victim.txt) that planted links point at."""
    from peer_rl.evaluation.config import SAMPLE_EVAL

    shutil.copytree(sample, tmp / "root")
    shutil.copy(SAMPLE_EVAL / "esc_cards.json", tmp / "cards.json")
    shutil.copy(SAMPLE_EVAL / "sage_profiles.jsonl", tmp / "profiles.jsonl")
    (tmp / "esconv.json").write_text(json.dumps([{"emotion_type": "sadness", "problem_type":
                                                  "job", "dialog": [
        {"speaker": "seeker", "content": "I lost my job."},
        {"speaker": "supporter", "content": "That sounds hard.",
         "annotation": {"strategy": "Question"}},
        {"speaker": "seeker", "content": "It is."},
        {"speaker": "supporter", "content": "What happened?",
         "annotation": {"strategy": "Question"}}]}]))
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text("{}")
    (tmp / "model" / "model.safetensors").write_bytes(b"")   # a whole model directory
    (tmp / "chain.yaml").write_text("out: unset\nstages: []\n")
    (tmp / "run").mkdir()                                     # a training run's directory
    (tmp / "run" / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 1.5}\n')
    (tmp / "theirs").mkdir()
    (tmp / "theirs" / "notes.txt").write_text("someone's notes\n")
    (tmp / "theirs" / "grpo").mkdir()
    (tmp / "theirs" / "grpo" / "esconv.jsonl").write_text("someone's rows\n")
    (tmp / "theirs.json").write_text('{"mine": true}\n')
    (tmp / "victim.txt").write_text(VICTIM_TEXT)
    return tmp


def _tree(root: Path, skip: Path | None = None) -> dict[str, str]:
    """sha256 per file (a link: its target's); `skip`: the output the command may write, and
    the marker beside it that records a file output."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()
            and (skip is None or not (p == skip or skip in p.parents
                                      or p == skip.parent / MARKER))}


def _links(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): os.readlink(p) for p in sorted(root.rglob("*"))
            if p.is_symlink()}


def _out(cmd: Cmd, layout: str, w: Path) -> Path:
    inp = w / cmd.input
    if layout == "out_is_input":
        return inp
    if layout == "out_inside_input":   # a directory input: below it; a file: its directory
        return inp / "exemplars" if inp.is_dir() else inp.parent
    if layout == "out_is_input_file":
        return _grpo_input(w)
    if layout == "not_its_own":
        return w / ("theirs.json" if cmd.output == "file" else "theirs")
    return w / ("own.json" if cmd.output == "file" else "own")


def _make_own(cmd: Cmd, out: Path) -> None:
    """The command's earlier output, as its marker records it."""
    if cmd.output == "file":
        out.write_text('{"earlier": true}\n')
        (out.parent / MARKER).write_text(json.dumps({"files": {out.name: cmd.name}}))
    elif cmd.output == "root":         # import-esconv: its file under grpo/ of a root
        (out / "grpo").mkdir(parents=True)
        (out / "grpo" / "esconv.jsonl").write_text("earlier\n")
        (out / "grpo" / MARKER).write_text(json.dumps({"files": {"esconv.jsonl": cmd.name}}))
    else:
        out.mkdir()
        (out / "earlier.txt").write_text("an earlier output\n")
        (out / MARKER).write_text(json.dumps({"command": cmd.owner or cmd.name}))


def _plant(cmd: Cmd, layout: str, out: Path, w: Path) -> list[Path]:
    """A user's files for a PLANTS layout, around the earlier output `_make_own` made (for
    lock_alone: in place of it); returns those inside `out`, to be found as they were."""
    victim = w / "victim.txt"
    if layout == "lock_alone":         # a directory holding only a .lock, a link to their file
        out.mkdir()
        (out / ".lock").symlink_to(victim)
        return []
    _make_own(cmd, out)
    marker_dir = {"file": out.parent, "root": out / "grpo"}.get(cmd.output, out)
    if layout == "lock_link_in_own":
        (out / ".lock").symlink_to(victim)
        return [out / ".lock"]
    if layout == "tmp_links":          # the names writes used to take, as links to their file
        (marker_dir / (MARKER + ".tmp")).symlink_to(victim)
        out.with_name(out.name + ".tmp").symlink_to(victim)
        return [marker_dir / (MARKER + ".tmp")] if marker_dir != out.parent else []
    if layout == "old_new_beside":     # their copies of the earlier output, by hand
        for suffix in (".old", ".new"):
            copy = out.with_name(out.name + suffix)
            (shutil.copytree if out.is_dir() else shutil.copy)(out, copy)
            (copy / "kept.txt" if out.is_dir() else copy).write_text(f"their {suffix} copy\n")
        return []
    if layout == "extra_in_own":
        (marker_dir / "mine.txt").write_text("a file of theirs inside the output\n")
        return [marker_dir / "mine.txt"]
    # dry_run: a stage marked done by a damaged JSON mark inside the earlier output
    (w / "chain.yaml").write_text("out: unset\nstages:\n  - {name: s, run: \"models list\", "
                                  "done: \"${out}/s.json\"}\n")
    (out / "s.json").write_text('{"cut off')
    return [out / "s.json"]


def _expect_refusal(cmd, layout):
    if layout == "lock_alone":         # a lone .lock is not ours: the directory is not empty
        return True
    if layout == "lock_link_in_own":   # the lock a command takes is never a link
        return cmd.locks
    if layout in PLANTS or layout == "its_own_earlier_output":
        return False
    # adding a file to the directory that holds its input file is import-esconv's use
    return not (cmd.output == "root" and layout == "out_inside_input")


def _layouts(cmd: Cmd) -> tuple[str, ...]:
    """The layouts that can arise: a command with no input has only the last two; one whose
    input is a file has no file inside its input (out_is_input is that file). Of PLANTS: the
    .lock layouts where the command owns a directory, a user's file inside an output where
    the output is a directory, their copies beside one that is replaced, --dry-run where the
    command has it."""
    if not cmd.input:
        hostile = LAYOUTS[3:]
    else:
        hostile = LAYOUTS if cmd.input == "root" else tuple(x for x in LAYOUTS
                                                            if x != "out_is_input_file")
    plants = ["tmp_links"]
    if cmd.output == "dir":
        plants += ["lock_alone", "lock_link_in_own"]
    if cmd.output != "file":
        plants += ["extra_in_own"]
    if cmd.output != "root":
        plants += ["old_new_beside"]
    if cmd.dry_run:
        plants += ["dry_run"]
    return hostile + tuple(x for x in PLANTS if x in plants)


CASES = [(c, lay) for c in COMMANDS for lay in _layouts(c)]


@pytest.mark.parametrize("cmd,layout", CASES, ids=[f"{c.name}-{lay}" for c, lay in CASES])
def test_every_writer_against_every_hostile_layout(cmd, layout, tmp_path, monkeypatch, capsys,
                                                   sample):
    w = _world(tmp_path, sample)
    out = _out(cmd, layout, w)
    inside = []
    if layout == "its_own_earlier_output":
        _make_own(cmd, out)
    elif layout in PLANTS:
        inside = _plant(cmd, layout, out, w)
    argv = cmd.argv(str(out), w) + (["--force"] if cmd.force else []) \
        + (["--dry-run"] if layout == "dry_run" else [])
    if cmd.work:
        module, attr = cmd.work.split(":")

        def reached(*a, **k):
            raise Reached(cmd.name)

        monkeypatch.setattr(f"{module}.{attr}", cmd.stand_in or reached)
    refused = _expect_refusal(cmd, layout)
    before = _tree(w, skip=None if refused or layout == "dry_run" else out)
    links = _links(w)
    kept = {p: p.read_bytes() if not p.is_symlink() else os.readlink(p) for p in inside}
    if refused:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(out) in err, err
        assert _tree(w) == before       # inputs, their files and the other directory: as they were
        assert _links(w) == links and (w / "victim.txt").read_text() == VICTIM_TEXT
        return
    try:
        code = main(argv)
    except Reached:
        code = "reached"
    err = capsys.readouterr().err
    assert code in ("reached", 0, 1), err     # fit exits 1 when rows differ from its template
    assert _tree(w, skip=None if layout == "dry_run" else out) == before
    assert (w / "victim.txt").read_text() == VICTIM_TEXT
    assert _links(w) == links                 # no link removed, replaced or followed away
    assert {p: p.read_bytes() if not p.is_symlink() else os.readlink(p) for p in inside} == kept


def test_fit_never_writes_through_a_planted_tmp_link(tmp_path, sample):
    """Issue 58.2, as found: `judge-template fit --out jt/tpl.json` with `jt/tpl.json.tmp ->
    ../victim.txt` overwrote the victim and left tpl.json a link to it."""
    w = _world(tmp_path, sample)
    (w / "jt").mkdir()
    (w / "jt" / "tpl.json.tmp").symlink_to("../victim.txt")
    assert main(["judge-template", "fit", str(w / "root"), "--out", str(w / "jt/tpl.json")]) \
        in (0, 1)
    assert (w / "victim.txt").read_text() == VICTIM_TEXT
    assert not (w / "jt" / "tpl.json").is_symlink()
    assert json.loads((w / "jt" / "tpl.json").read_text())          # the template, whole
    assert os.readlink(w / "jt" / "tpl.json.tmp") == "../victim.txt"


def test_index_build_force_keeps_their_old_copy_and_their_files(tmp_path, monkeypatch, sample):
    """Issue 58.3, as found: `index build --force` deleted the user's OUT.old (a copy of the
    index kept by hand) and files it did not write inside its own earlier output, where
    `data sample --force` keeps them. Both keep them now."""
    monkeypatch.setattr("peer_rl.models.encoders.load_embedding_model", _encoder)
    w = _world(tmp_path, sample)
    idx = w / "idx"
    build = ["index", "build", str(w / "root"), "--out", str(idx)]
    assert main(build) == 0
    (idx / "notes.txt").write_text("why I built it\n")
    shutil.copytree(idx, w / "idx.old")
    old_copy = _tree(w / "idx.old")
    assert main(build + ["--force"]) == 0
    assert (idx / "notes.txt").read_text() == "why I built it\n"
    assert _tree(w / "idx.old") == old_copy
    assert sorted(p.name for p in w.iterdir() if p.name.startswith(("idx", ".idx"))) == \
        ["idx", "idx.old"]                            # no staging left behind
    sample = w / "sample"
    assert main(["data", "sample", "--out", str(sample)]) == 0
    (sample / "notes.txt").write_text("mine\n")
    assert main(["data", "sample", "--out", str(sample), "--force"]) == 0
    assert (sample / "notes.txt").read_text() == "mine\n"


def test_a_model_build_swaps_in_without_touching_their_dir_old_and_new(tmp_path):
    """Issue 58.4, as found: tiny_cache.swap_in (the last step of `models build-tiny` and
    `build-smollm2 --out`) deleted DIR.old and DIR.new whatever they held."""
    out = tmp_path / "tiny"
    for suffix in (".old", ".new"):
        (tmp_path / f"tiny{suffix}").mkdir()
        (tmp_path / f"tiny{suffix}" / "weights.bin").write_bytes(suffix.encode() * 100)
    before = _tree(tmp_path)
    build = _fake_build("models build-tiny")
    build(out)
    build(out)                                           # a rebuild replaces its own
    assert _tree(tmp_path, skip=out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny", "tiny.new", "tiny.old"]
    assert json.loads((out / MARKER).read_text())["command"] == "models build-tiny"


def _subcommands(p: argparse.ArgumentParser, prefix=()) -> dict[str, argparse.ArgumentParser]:
    found = {}
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                inner = _subcommands(sub, (*prefix, name))
                found |= inner or {" ".join((*prefix, name)): sub}
    return found


def test_the_table_holds_every_subcommand_that_writes():
    """A new subcommand with --out (or a trainer.output_dir) must join the table above."""
    every = _subcommands(parser())
    assert len(every) > 25                         # the walk found the commands
    writers = {c.name for c in COMMANDS} - {"bench trl"}
    assert writers | NOT_WRITERS == set(every), sorted(set(every) - writers - NOT_WRITERS)
    with_out = {n for n, sub in every.items()
                if any("--out" in a.option_strings for a in sub._actions)}
    assert with_out <= writers
