"""A command that writes a root never writes into its input, never replaces files it did not
make (not even with --force), and a name from the command line cannot climb out. Every writing
subcommand against the same layouts: tests/test_writers.py. The helpers that open files for
writing (issue 58): no link followed, no name opened that they did not make, nothing removed
that they cannot show they wrote, and no claim lost among several processes."""
import json
import os
from pathlib import Path

import pytest

from peer_rl.cli import main
from peer_rl.config.schema import ConfigError
from peer_rl.files.out_paths import OutputError, plain_name, refuse_inside
from peer_rl.data.bundled import copy_sample


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    out = tmp_path_factory.mktemp("root")
    copy_sample(out)      # build_sample's output: tests/data/test_sample_stats_import.py
    return out


def _snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_data_sample_refuses_a_directory_it_did_not_write_even_with_force(tmp_path, capsys):
    (tmp_path / "ser").mkdir()
    (tmp_path / "ser" / "mine.jsonl").write_text('{"id": 1}\n')
    for force in ([], ["--force"]):
        assert main(["data", "sample", "--out", str(tmp_path), *force]) == 2
        assert "did not write (ser)" in capsys.readouterr().err
        assert [p.name for p in tmp_path.rglob("*")] == ["ser", "mine.jsonl"]
    out = tmp_path / "sample"
    assert main(["data", "sample", "--out", str(out)]) == 0
    assert main(["data", "sample", "--out", str(out)]) == 2
    assert "pass --force to replace it" in capsys.readouterr().err
    assert main(["data", "sample", "--out", str(out), "--force"]) == 0


def test_data_rounds_refuses_its_own_input_and_existing_files(root, tmp_path, capsys):
    before = _snapshot(root)
    assert main(["data", "rounds", str(root), "--out", str(root)]) == 2
    assert "is the input" in capsys.readouterr().err
    assert main(["data", "rounds", str(root), "--out", str(root / "nested")]) == 2
    assert "inside the input" in capsys.readouterr().err
    assert main(["data", "rounds", str(root / "grpo" / "textual.jsonl"),
                 "--out", str(root / "x")]) == 2
    assert _snapshot(root) == before and not (root / "nested").exists()
    out = tmp_path / "out"
    assert main(["data", "rounds", str(root), "--out", str(out)]) == 0
    first = (out / "grpo" / "textual.jsonl").read_text()
    assert main(["data", "rounds", str(root), "--out", str(out), "--seed", "3"]) == 2
    assert "holds an earlier `peer-rl data rounds` output" in capsys.readouterr().err
    assert (out / "grpo" / "textual.jsonl").read_text() == first
    assert main(["data", "rounds", str(root), "--out", str(out), "--seed", "3", "--force"]) == 0


def test_import_esconv_names_stay_in_grpo_and_do_not_overwrite(tmp_path, capsys):
    src = tmp_path / "esconv.json"
    src.write_text(json.dumps([{"emotion_type": "sadness", "problem_type": "job", "dialog": [
        {"speaker": "seeker", "content": "I lost my job."},
        {"speaker": "supporter", "content": "That sounds hard.", "annotation": {"strategy": "Question"}},
        {"speaker": "seeker", "content": "It is."},
        {"speaker": "supporter", "content": "What happened?", "annotation": {"strategy": "Question"}}]}]))
    out = tmp_path / "root"
    for name in ("../escape.jsonl", "..", "a/b.jsonl"):
        assert main(["data", "import-esconv", str(src), "--out", str(out), "--name", name]) == 2
        assert "plain file name" in capsys.readouterr().err
    assert not (tmp_path / "escape.jsonl").exists()
    (out / "grpo").mkdir(parents=True)
    (out / "grpo" / "esconv.jsonl").write_text("mine\n")
    for force in ([], ["--force"]):         # not its own file: refused either way
        assert main(["data", "import-esconv", str(src), "--out", str(out), *force]) == 2
        assert "not written by `peer-rl data import-esconv`" in capsys.readouterr().err
    assert (out / "grpo" / "esconv.jsonl").read_text() == "mine\n"
    assert main(["data", "import-esconv", str(src), "--out", str(out), "--name", "b.jsonl"]) == 0
    first = (out / "grpo" / "b.jsonl").read_text()
    assert main(["data", "import-esconv", str(src), "--out", str(out), "--name", "b.jsonl"]) == 2
    assert main(["data", "import-esconv", str(src), "--out", str(out), "--name", "b.jsonl",
                 "--force"]) == 0             # its own file, with --force
    assert (out / "grpo" / "b.jsonl").read_text() == first


def test_filter_and_rewrite_refuse_an_output_inside_their_input(root):
    from peer_rl.datajobs.filter import run_filter
    from peer_rl.datajobs.rewrite import run_rewrite

    with pytest.raises(OutputError, match="inside the input"):
        run_filter(root, root / "filtered", cfg=None)
    with pytest.raises(OutputError, match="is the input"):
        run_rewrite(root, root, root, cfg=None)


def test_names_and_nesting_helpers(tmp_path):
    assert plain_name("esconv.jsonl", "--name") == "esconv.jsonl"
    for bad in ("", ".", "..", "a/b", "a\\b"):
        with pytest.raises(OutputError):
            plain_name(bad, "--name")
    refuse_inside(tmp_path / "out", [tmp_path / "in"])          # siblings are fine
    with pytest.raises(OutputError, match="inside the input"):
        refuse_inside(tmp_path / "in" / "deep" / "er", [tmp_path / "in"])


def test_a_ladder_rung_cannot_climb_out_of_its_directory(tmp_path):
    from peer_rl.evaluation.ladder import load_ladder

    path = tmp_path / "l.yaml"
    path.write_text("protocol: diversity\nrungs:\n  - {name: '..', overrides: []}\n")
    with pytest.raises(ConfigError, match="plain names"):
        load_ladder(str(path), [])


def test_a_run_begun_before_markers_is_continued_by_its_run_file(tmp_path):
    """An evaluation or data-job directory with no marker but its run file (run.json, as the
    store writes it) is that command's run: a rerun continues it. Another file is not enough."""
    from peer_rl.files.out_paths import MARKER, claim_dir

    old = tmp_path / "esc_run"
    old.mkdir()
    (old / "run.json").write_text('{"protocol": "esc"}')
    (old / "cases.jsonl").write_text("")
    claim_dir(old, "eval esc", resume=True, run_state="run.json")
    assert json.loads((old / MARKER).read_text())["command"] == "eval esc"
    other = tmp_path / "notes"
    other.mkdir()
    (other / "cases.jsonl").write_text("mine\n")
    with pytest.raises(OutputError, match="did not write"):
        claim_dir(other, "eval esc", resume=True, run_state="run.json")


def test_a_claimed_directory_left_unwritten_is_released_and_a_written_one_kept(tmp_path):
    from peer_rl.files.out_paths import LOCK_FILE, MARKER, claim_run_dir, release_unwritten

    out = tmp_path / "run"
    lock = claim_run_dir(out, "train-rm")
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, LOCK_FILE])
    release_unwritten(out)                      # refused before writing: nothing left behind
    lock.close()
    assert not out.exists()
    lock = claim_run_dir(out, "train-rm")
    (out / "config.yaml").write_text("x")
    release_unwritten(out)                      # it wrote: kept
    lock.close()
    assert (out / "config.yaml").read_text() == "x"


# ------------------------------------------------------------------ issue 58: nothing lost
VICTIM = "the user's own words\n"


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    return victim


def test_a_planted_lock_is_never_truncated_or_written(tmp_path):
    """Finding 58.1: `.lock` a link to a user's file had that file replaced by our pid; a
    directory holding only `.lock` counted as empty. A link, a second name of their file, or a
    file holding more than a pid is refused and left as it is; the lone `.lock` makes the
    directory someone else's."""
    from peer_rl.files.out_paths import LOCK_FILE, claim_dir, lock_dir

    victim = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).symlink_to(victim)
    with pytest.raises(OutputError, match="did not write"):
        claim_dir(out, "chain", resume=True)
    with pytest.raises(OutputError, match="not a lock peer-rl made"):
        lock_dir(out, "chain")
    (out / LOCK_FILE).unlink()
    (out / LOCK_FILE).hardlink_to(victim)              # the same file under a second name
    with pytest.raises(OutputError, match="not a lock peer-rl made"):
        lock_dir(out, "chain")
    (out / LOCK_FILE).unlink()
    (out / LOCK_FILE).write_text("my notes, not a pid\n")
    with pytest.raises(OutputError, match="not a lock peer-rl made"):
        lock_dir(out, "chain")
    assert victim.read_text() == VICTIM and (out / LOCK_FILE).read_text() == \
        "my notes, not a pid\n"
    (out / LOCK_FILE).unlink()
    lock = lock_dir(out, "chain")                      # made here: taken, our pid in it
    lock.close()
    lock = lock_dir(out, "chain")                      # made by peer-rl before: taken again
    assert (out / LOCK_FILE).read_text() == str(os.getpid())
    lock.close()


def test_a_whole_write_never_follows_a_planted_tmp_link(tmp_path):
    """Finding 58.2 (the helper): `X.tmp` a link to a user's file was written through."""
    from peer_rl.files.out_paths import write_atomic

    victim = _victim(tmp_path)
    target = tmp_path / "jt" / "tpl.json"
    target.parent.mkdir()
    (target.parent / "tpl.json.tmp").symlink_to(victim)
    write_atomic(target, '{"new": true}')
    assert victim.read_text() == VICTIM
    assert not target.is_symlink() and target.read_text() == '{"new": true}'
    assert os.readlink(target.parent / "tpl.json.tmp") == str(victim)
    assert sorted(p.name for p in target.parent.iterdir()) == ["tpl.json", "tpl.json.tmp"]


def test_a_staged_dir_keeps_what_the_old_output_did_not_write(tmp_path):
    """Findings 58.3 and 58.4 (the helper): OUT.old / OUT.new of the user's were deleted, and
    so were their files inside the earlier output. Now the swap uses names it makes, and of the
    old output drops only what its marker says the command wrote."""
    from peer_rl.files.out_paths import MARKER, read_marker, staged_dir

    out = tmp_path / "idx"
    for suffix in (".old", ".new", ".tmp"):
        (tmp_path / f"idx{suffix}").mkdir()
        (tmp_path / f"idx{suffix}" / "index.json").write_text(f"their {suffix} copy")
    with staged_dir(out, command="index build") as first:
        (first / "index.json").write_text("1")
        (first / "stale.bin").write_text("written by the first build only")
    assert read_marker(out) == {"command": "index build", "wrote": ["index.json", "stale.bin"]}
    (out / "notes.txt").write_text("mine")
    with staged_dir(out, command="index build") as second:
        (second / "index.json").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "index.json", "notes.txt"]
    assert (out / "index.json").read_text() == "2" and (out / "notes.txt").read_text() == "mine"
    for suffix in (".old", ".new", ".tmp"):
        assert (tmp_path / f"idx{suffix}" / "index.json").read_text() == f"their {suffix} copy"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx", "idx.new", "idx.old", "idx.tmp"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / MARKER).write_text('{"command": "data sample"}')
    with pytest.raises(OutputError, match="data sample"):
        with staged_dir(tmp_path / "other", command="index build"):
            pass


def test_a_damaged_mark_set_aside_never_replaces_an_earlier_copy(tmp_path):
    """Finding 58.5 (the helper): a second damaged mark replaced the first kept copy."""
    from peer_rl.files.out_paths import move_aside

    mark = tmp_path / "judge.json"
    mark.write_text("first {")
    assert move_aside(mark, ".damaged").name == "judge.json.damaged"
    mark.write_text("second {")
    assert move_aside(mark, ".damaged").name == "judge.json.damaged.1"
    assert (tmp_path / "judge.json.damaged").read_text() == "first {"
    assert (tmp_path / "judge.json.damaged.1").read_text() == "second {"
    assert not mark.exists()


def test_an_append_never_follows_a_link(tmp_path):
    from peer_rl.files.out_paths import open_append

    victim = _victim(tmp_path)
    (tmp_path / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(OutputError, match="is a link"):
        open_append(tmp_path / "metrics.jsonl")
    assert victim.read_text() == VICTIM
    with open_append(tmp_path / "log.jsonl") as fh:
        fh.write("{}\n")
    assert (tmp_path / "log.jsonl").read_text() == "{}\n"


def _claim_many(args):
    """One process's claims: (claimed names, failures as 'name: error')."""
    from peer_rl.files.out_paths import claim_file

    directory, who, n = args
    ok, failed = [], []
    for i in range(n):
        name = f"p{who}-{i}.json"
        try:
            claim_file(Path(directory) / name, "judge-template fit")
            ok.append(name)
        except Exception as exc:                 # noqa: BLE001 - counted, then asserted none
            failed.append(f"{name}: {exc!r}")
    return ok, failed


def _write_many(args):
    from peer_rl.files.out_paths import write_atomic

    path, who, n = args
    for i in range(n):
        write_atomic(path, json.dumps({"writer": who, "i": i, "pad": "x" * 4000}))
    return who


@pytest.mark.e2e   # a pool of forked processes
def test_claims_from_several_processes_in_one_directory_all_land(tmp_path):
    """Finding 58.6: processes claiming files in one directory collided on the marker's one
    temporary file (94 of 400 claims failed) and overwrote each other's marker (115 claims
    missing, after which --force refused the command's own file). Every claim must succeed
    here (the names differ), and the marker must hold each one."""
    import multiprocessing

    from peer_rl.files.out_paths import MARKER, claim_file, read_marker

    procs, each = 4, 60
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        results = pool.map(_claim_many, [(str(tmp_path), k, each) for k in range(procs)])
    claimed = [n for ok, _ in results for n in ok]
    failed = [f for _, bad in results for f in bad]
    assert failed == [] and len(claimed) == procs * each
    files = read_marker(tmp_path)["files"]
    assert sorted(files) == sorted(claimed)
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER]   # no temporary file left
    for name in claimed[:3]:                     # each is the command's own: --force takes it
        (tmp_path / name).write_text("{}")
        claim_file(tmp_path / name, "judge-template fit", force=True)


@pytest.mark.e2e   # a pool of forked processes
def test_a_file_written_whole_by_several_processes_is_one_of_theirs(tmp_path):
    """Done-files and reports under concurrent writers: every write lands whole (no process
    fails on another's temporary file), the file is one writer's last content, nothing left."""
    import multiprocessing

    path = tmp_path / "done.json"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        assert sorted(pool.map(_write_many, [(path, k, 40) for k in range(4)])) == [0, 1, 2, 3]
    found = json.loads(path.read_text())
    assert found["i"] == 39 and found["writer"] in range(4)
    assert [p.name for p in tmp_path.iterdir()] == ["done.json"]
