"""`peer-rl eval`'s driver before any party opens: what it refuses and leaves unwritten."""
import pytest

from peer_rl.errors import ConfigError
from peer_rl.evaluation.config import SAMPLE_EVAL, load_eval_config
from peer_rl.evaluation.run import evaluate


def test_languages_that_keep_no_case_stop_before_anything_is_written(tmp_path):
    """SAGE's published profiles are all Chinese: an English-only model (languages=[english])
    has nothing to talk about, and an empty report would read as a finished evaluation."""
    zh = [ln for ln in (SAMPLE_EVAL / "sage_profiles.jsonl").read_text().splitlines()
          if '"sample-zh' in ln]
    assert len(zh) >= 1
    profiles = tmp_path / "profiles_zh.jsonl"
    profiles.write_text("\n".join(zh) + "\n")
    cfg = load_eval_config("sage", ["model.path=/no/model", "seeker.path=/no/model",
                                    f"sage.profiles={profiles}", "languages=[english]"])
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as err:
        evaluate("sage", cfg, out)
    assert str(err.value) == (
        f"eval sage: languages=['english'] keeps none of the cases in {profiles} (left out: "
        f"{len(zh)} chinese); evaluate a model that reads them with languages= naming theirs, "
        "or give inputs in a language it reads")
    assert not out.exists()
