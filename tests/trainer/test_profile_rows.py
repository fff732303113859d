"""The seeker profiles a dialogue run trains on (peer_rl.trainer.run.profile_rows): the bundled
sample as rows, and a bad file refused naming the key, the file and the line."""
import pytest

from peer_rl.config.schema import load_config
from peer_rl.data.prompt_loader import PromptPoolError
from peer_rl.evaluation.cases import CaseFileError
from peer_rl.trainer.run import profile_rows


def test_the_bundled_profiles_become_rows_in_file_order():
    rows = profile_rows(load_config(["recipe=dialogue_tiny"]))
    assert [r["id"] for r in rows] == ["sample-zh-1", "sample-zh-2", "sample-en-1"]
    assert [r["language"] for r in rows] == ["zh", "zh", "en"]
    assert all(r["persona"] and r["opening"] for r in rows)


def test_a_missing_or_malformed_profiles_file_is_refused_naming_it(tmp_path):
    missing = tmp_path / "none.jsonl"
    with pytest.raises(PromptPoolError, match=f"dialogue.profiles: {missing} is not a file"):
        profile_rows(load_config(["recipe=dialogue_tiny", f"dialogue.profiles={missing}"]))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "player": "a"}\nnot json\n')
    with pytest.raises(CaseFileError, match=r"bad.jsonl:2: not valid JSON"):
        profile_rows(load_config(["recipe=dialogue_tiny", f"dialogue.profiles={bad}"]))
    assert bad.read_text() == '{"id": "x", "player": "a"}\nnot json\n'      # never written
