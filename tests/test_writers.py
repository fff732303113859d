"""Every `peer-rl` subcommand that writes, held against the same hostile layouts: an output
that is an input directory, inside one (or holding the input file), an input file, a directory
or file the command did not write (refused even with --force), and the command's own earlier
output (let through: with --force, or continued where a rerun resumes).

A refusal is exit 2 with one line naming the output, and nothing under the inputs or the other
directories changes (every file's bytes compared before and after). Where what follows the
check is heavy (Ray, vLLM, an endpoint), the test replaces that next step by one that raises
`Reached`: what is tested is that the output check lets the command through to its work.
"""
import argparse
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from peer_rl.cli import main, parser
from peer_rl.data.bundled import build_sample

MARKER = ".peer-rl-out.json"          # spelled out here: the format is part of the contract
PARTIES = ["model.url=http://127.0.0.1:9/v1", "seeker.url=http://127.0.0.1:9/v1",
           "judge.url=http://127.0.0.1:9/v1"]
JOB_PARTIES = [f"{r}.url=http://127.0.0.1:9/v1" for r in
               ("judge", "writer", "client", "counselor", "teacher")]


class Reached(Exception):
    """The command got past its output check to its work."""


@dataclass(frozen=True)
class Cmd:
    name: str            # the subcommand as a user types it (the marker's command)
    argv: object         # (out, world) -> argument list
    input: str           # "root" (the data root), a path relative to the world, or "" (none)
    output: str = "dir"  # dir: a directory the command owns; file: one file it writes
    force: bool = True   # the command has --force (else a rerun continues its own output)
    work: str = ""       # "module:attr" replaced by Reached (empty: the command runs for real)
    owner: str = ""      # the marker's command when it is not `name` (a stage's front door)


def _grpo_input(w):
    return w / "root" / "grpo" / "textual.jsonl"


COMMANDS = [
    Cmd("data sample", lambda o, w: ["data", "sample", "--out", o], ""),
    Cmd("data to-verl", lambda o, w: ["data", "to-verl", str(w / "root"), "--out", o], "root",
        work="peer_rl.data.verl_export:export_verl"),
    Cmd("data import-esconv", lambda o, w: ["data", "import-esconv", str(w / "esconv.json"),
                                            "--out", o], "esconv.json", output="root"),
    Cmd("data rounds", lambda o, w: ["data", "rounds", str(w / "root"), "--out", o], "root"),
    Cmd("data filter", lambda o, w: ["data", "filter", str(w / "root"), "--out", o,
                                     *JOB_PARTIES], "root", force=False,
        work="peer_rl.datajobs.job:run_job"),
    Cmd("data personas", lambda o, w: ["data", "personas", str(w / "root"), "--out", o,
                                       *JOB_PARTIES], "root", force=False,
        work="peer_rl.datajobs.job:run_job"),
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
        work="peer_rl.cli.index:load_exemplars"),
    Cmd("models build-tiny", lambda o, w: ["models", "build-tiny", "--out", o], "",
        work="peer_rl.trainer.tiny_cache:build_shipped_tiny_models"),
    Cmd("models build-smollm2", lambda o, w: ["models", "build-smollm2", "--out", o], "",
        work="peer_rl.trainer.shipped_adapters:build_shipped_adapters"),
    Cmd("models use-smollm2", lambda o, w: ["models", "use-smollm2", "judge", "--out", o,
                                            f"data.root={w / 'root'}",
                                            f"model.path={w / 'model'}"], "root", force=False,
        work="peer_rl.trainer.shipped_adapters:config_inputs", owner="train-rm"),
    Cmd("eval rm", lambda o, w: ["eval", "rm", "--data", str(w / "root"), "--model",
                                 str(w / "model"), "--out", o], "root", output="file",
        work="peer_rl.evaluation.rm:evaluate_rm"),
    Cmd("eval pairs", lambda o, w: ["eval", "pairs", "--data", str(w / "root"), "--model",
                                    str(w / "model"), "--out", o], "root", output="file",
        work="peer_rl.evaluation.pairs:evaluate_pairs"),
    Cmd("eval esc", lambda o, w: ["eval", "esc", "--out", o, f"esc.cards={w / 'cards.json'}",
                                  *PARTIES], "cards.json", force=False,
        work="peer_rl.evaluation.run:open_parties"),
    Cmd("eval sage", lambda o, w: ["eval", "sage", "--out", o,
                                   f"sage.profiles={w / 'profiles.jsonl'}", *PARTIES],
        "profiles.jsonl", force=False, work="peer_rl.evaluation.run:open_parties"),
    Cmd("eval safety", lambda o, w: ["eval", "safety", "--out", o, f"safety.root={w / 'root'}",
                                     *PARTIES], "root", force=False,
        work="peer_rl.evaluation.run:open_parties"),
    Cmd("eval diversity", lambda o, w: ["eval", "diversity", "--out", o,
                                        f"diversity.root={w / 'root'}", *PARTIES], "root",
        force=False, work="peer_rl.evaluation.run:open_parties"),
    Cmd("eval ccj", lambda o, w: ["eval", "ccj", "--out", o, f"ccj.root={w / 'root'}",
                                  *PARTIES], "root", force=False,
        work="peer_rl.evaluation.run:open_parties"),
    Cmd("eval ladder", lambda o, w: ["eval", "ladder", "escrag_ablation", "--out", o], "",
        force=False, work="peer_rl.evaluation.ladder:run_ladder"),
    Cmd("eval compare", lambda o, w: ["eval", "compare", str(w / "root"), "--out", o], "root",
        work="peer_rl.evaluation.report:compare_runs"),
    Cmd("bench trl", lambda o, w: ["bench", "trl", "--peer-only", "--json", o], "",
        output="file", work="peer_rl.bench.trl:_model"),
    Cmd("chain", lambda o, w: ["chain", str(w / "chain.yaml"), f"out={o}"], "", force=False),
    Cmd("train", lambda o, w: ["train", f"trainer.output_dir={o}", f"data.root={w / 'root'}"],
        "root", force=False, work="peer_rl.trainer.run:load_prompts"),
    Cmd("sft", lambda o, w: ["sft", f"trainer.output_dir={o}", f"data.root={w / 'root'}"],
        "root", force=False, work="peer_rl.trainer.supervised:plan_stage"),
    Cmd("train-rm", lambda o, w: ["train-rm", f"trainer.output_dir={o}",
                                  f"data.root={w / 'root'}"], "root", force=False,
        work="peer_rl.trainer.supervised:plan_stage"),
]
# write nothing, or only the pinned-model cache (never a path from the command line); of the
# benchmarks (their own parsers), `bench trl --json FILE` writes and is in the table
NOT_WRITERS = {"data check", "data stats", "judge-template check", "index query", "chat",
               "bench", "models list", "models fetch", "plan"}   # plan only prints
LAYOUTS = ("out_is_input", "out_inside_input", "out_is_input_file", "not_its_own",
           "its_own_earlier_output")


def _world(tmp: Path) -> Path:
    """A data root and the other files the commands read, plus a directory of someone else's."""
    from peer_rl.evaluation.config import SAMPLE_EVAL

    build_sample(tmp / "root")
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
    (tmp / "theirs").mkdir()
    (tmp / "theirs" / "notes.txt").write_text("someone's notes\n")
    (tmp / "theirs" / "grpo").mkdir()
    (tmp / "theirs" / "grpo" / "esconv.jsonl").write_text("someone's rows\n")
    (tmp / "theirs.json").write_text('{"mine": true}\n')
    return tmp


def _tree(root: Path, skip: Path | None = None) -> dict[str, str]:
    """sha256 per file; `skip`: the output the command may write, and the marker beside it
    that records a file output."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()
            and (skip is None or not (p == skip or skip in p.parents
                                      or p == skip.parent / MARKER))}


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


def _expect_refusal(cmd, layout):
    if layout == "its_own_earlier_output":
        return False
    # adding a file to the directory that holds its input file is import-esconv's use
    return not (cmd.output == "root" and layout == "out_inside_input")


def _layouts(cmd: Cmd) -> tuple[str, ...]:
    """The layouts that can arise: a command with no input has only the last two; one whose
    input is a file has no file inside its input (out_is_input is that file)."""
    if not cmd.input:
        return LAYOUTS[3:]
    return LAYOUTS if cmd.input == "root" else tuple(x for x in LAYOUTS
                                                     if x != "out_is_input_file")


CASES = [(c, lay) for c in COMMANDS for lay in _layouts(c)]


@pytest.mark.parametrize("cmd,layout", CASES, ids=[f"{c.name}-{lay}" for c, lay in CASES])
def test_every_writer_against_every_hostile_layout(cmd, layout, tmp_path, monkeypatch, capsys):
    w = _world(tmp_path)
    out = _out(cmd, layout, w)
    if layout == "its_own_earlier_output":
        _make_own(cmd, out)
    argv = cmd.argv(str(out), w) + (["--force"] if cmd.force else [])
    if cmd.work:
        module, attr = cmd.work.split(":")

        def reached(*a, **k):
            raise Reached(cmd.name)

        monkeypatch.setattr(f"{module}.{attr}", reached)
    refused = _expect_refusal(cmd, layout)
    before = _tree(w, skip=None if refused else out)
    if refused:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(out) in err, err
        assert _tree(w) == before       # inputs, their files and the other directory: as they were
        return
    try:
        code = main(argv)
    except Reached:
        code = "reached"
    err = capsys.readouterr().err
    assert code in ("reached", 0, 1), err     # fit exits 1 when rows differ from its template
    assert _tree(w, skip=out) == before


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
