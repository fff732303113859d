"""The test-fixture cache: what its key covers and when it builds."""
import pytest

from fixture_cache import ROOT, cached, import_closure, source_key


def test_the_key_covers_imports_made_inside_functions_and_nothing_unrelated():
    files = {p.relative_to(ROOT).as_posix()
             for p in import_closure(["peer_rl.trainer.supervised_run"])}
    # the launcher imports the tiny models, the loop the Bradley-Terry loss and the FSDP
    # plumbing, only inside functions
    assert {"peer_rl/supervised/bradley_terry.py", "peer_rl/supervised/tiny_models.py",
            "workers/supervised.py", "workers/fsdp.py", "peer_rl/__init__.py",
            "peer_rl/supervised/__init__.py", "workers/__init__.py"} <= files
    assert "peer_rl/trainer/controller.py" not in files and "workers/rollout.py" not in files


def test_a_key_changes_with_the_entries():
    assert source_key(["peer_rl.supervised.tiny_models"]) == source_key(["peer_rl.supervised.tiny_models"])
    assert source_key(["peer_rl.supervised.tiny_models"]) != source_key(["peer_rl.algos.rewards"])


def test_a_cached_fixture_is_built_once_and_never_half(tmp_path, monkeypatch):
    monkeypatch.setenv("PEER_RL_TEST_CACHE", str(tmp_path / "cache"))
    builds = []

    def build(out):
        builds.append(out)
        out.mkdir()
        (out / "model").write_text("weights")

    def broken(out):
        out.mkdir()
        raise RuntimeError("interrupted")

    first = cached("m", ["peer_rl.algos.rewards"], build, tmp_path / "fresh")
    again = cached("m", ["peer_rl.algos.rewards"], build, tmp_path / "fresh")
    assert first == again and len(builds) == 1 and (first / "model").read_text() == "weights"
    with pytest.raises(RuntimeError, match="interrupted"):    # the build's error reaches us
        cached("n", ["peer_rl.algos.rewards"], broken, tmp_path / "fresh")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.name]   # no half entry


def test_off_builds_every_time_into_the_fresh_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("PEER_RL_TEST_CACHE", "off")
    builds = []
    for _ in range(2):
        assert cached("m", ["peer_rl.algos.rewards"], lambda out: builds.append(out),
                      tmp_path / "fresh") == tmp_path / "fresh"
    assert len(builds) == 2
