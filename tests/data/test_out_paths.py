"""A command that writes a root never writes into its input, never replaces files it did not
make (not even with --force), and a name from the command line cannot climb out. Every writing
subcommand against the same layouts: tests/test_writers.py."""
import json

import pytest

from peer_rl.cli import main
from peer_rl.config import ConfigError
from peer_rl.data.out_paths import OutputError, plain_name, refuse_inside
from peer_rl.data.bundled import build_sample


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    out = tmp_path_factory.mktemp("root")
    build_sample(out)
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
    from peer_rl.data.out_paths import MARKER, claim_dir

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
    from peer_rl.data.out_paths import LOCK_FILE, MARKER, claim_run_dir, release_unwritten

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
