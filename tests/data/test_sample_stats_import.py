import json
import os
from pathlib import Path

import numpy as np
import pytest

from peer_rl.cli import main
from peer_rl.data.esconv import import_esconv, normalise_strategy
from peer_rl.data.bundled import build_sample, sample_root
from peer_rl.data.round_sampling import gaussian_round_sample
from peer_rl.prompts.reasoning import STRATEGIES

REFERENCE = Path(os.environ.get("PEER_RL_REFERENCE", "PEER_RL_REFERENCE-is-not-set"))
FAILED_ESCONV = REFERENCE / "esconv" / "FailedESConv.json"


def test_build_sample_is_deterministic_and_matches_the_shipped_copy(tmp_path):
    counts = build_sample(tmp_path / "a")
    shipped = sample_root()
    for rel in counts:
        assert (tmp_path / "a" / rel).read_bytes() == (shipped / rel).read_bytes(), rel


def test_stats_prints_tables(capsys):
    assert main(["data", "stats", str(sample_root())]) == 0
    out = capsys.readouterr().out
    assert "ser/en/text_train.jsonl" in out and "preference=" in out and "group=" in out
    assert main(["data", "stats", str(sample_root()), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    ser = next(s for s in stats if s["file"] == "ser/zh/text_test.jsonl")
    assert set(ser["preference"]) == {"first", "second", "tie", "neither"}
    assert set(ser["step1"]) == {"True", "False"}


def test_gaussian_round_sample_centres_on_the_middle():
    rng = np.random.default_rng(0)
    picks = [r for _ in range(2000) for r in gaussian_round_sample(20, 1, rng)]
    assert 9.0 < np.mean(picks) < 11.5
    # the spread against the exact kept distribution: tests/data/test_round_sampling.py
    assert gaussian_round_sample(3, 5, rng) == [1, 2, 3]
    assert gaussian_round_sample(0, 2, rng) == []
    a = gaussian_round_sample(30, 4, np.random.default_rng(7))
    assert a == gaussian_round_sample(30, 4, np.random.default_rng(7)) and len(a) == 4


def test_strategy_aliases_map_into_the_eight():
    assert normalise_strategy("Questions") == "Question"
    assert normalise_strategy("Other") == "Others"
    assert normalise_strategy("Reflection of feelings") == "Reflection of Feelings"
    assert normalise_strategy("made up") is None
    from peer_rl.data.esconv import STRATEGY_ALIASES
    assert set(STRATEGY_ALIASES.values()) <= set(STRATEGIES)


def test_import_small_file_merges_turns_and_reports(tmp_path):
    src = tmp_path / "mini.json"
    src.write_text(json.dumps([
        {"dialog": [{"speaker": "seeker", "content": "hi"}, {"speaker": "seeker", "content": "I am sad"},
                    {"speaker": "supporter", "content": "Why?", "annotation": {"strategy": "Question"}},
                    {"speaker": "seeker", "content": "work"},
                    {"speaker": "supporter", "content": "That is hard.",
                     "annotation": {"strategy": "Weird"}}]},
        {"dialog": [{"speaker": "supporter", "content": "hello"}]},
        {"no": "dialog"},
    ]))
    rows, rep = import_esconv(src, rounds_per_dialogue=5)
    assert [r["solution"] for r in rows] == ["Why?", "That is hard."]
    assert rows[0]["history"] == [{"role": "seeker", "content": "hi I am sad"}]
    assert rows[1]["strategy"] == "" and rep.unknown_strategies["Weird"] == 1
    # written as the PEER card writes grpo rows: the corpus as source, card spellings
    assert {(r["source"], r["language"], r["modality"]) for r in rows} == \
        {("ESConv", "english", "textual")}
    assert rep.skipped["no dialog list"] == 1
    assert rep.skipped["dialogue without a supporter reply after a seeker turn"] == 1


def test_import_rejects_unknown_speaker(tmp_path):
    src = tmp_path / "bad.json"
    src.write_text(json.dumps([{"dialog": [{"speaker": "bot", "content": "x"}]}]))
    with pytest.raises(ValueError, match=r"bad.json\[0\].dialog\[0\].speaker"):
        import_esconv(src)


def _failed_esconv_style(path: Path, n: int = 6) -> Path:
    """Dialogues in FailedESConv.json's own shape (speaker/listener turns, annotation
    strategies with ESConv's spellings, survey fields), written for this test."""
    lines = [("speaker", "Hey there", None), ("speaker", "I lost my job last week.", None),
             ("listener", "I'm so sorry. How are you holding up?", "Questions"),
             ("speaker", "Not well. I can't sleep.", None),
             ("listener", "Losing a job can shake everything.", "Reflection of feelings"),
             ("listener", "Have you talked to anyone about it?", "Question"),
             ("speaker", "Only you, honestly.", None),
             ("listener", "I'm glad you reached out here.", "Affirmation and Reassurance"),
             ("speaker", "Thanks. Bye.", None), ("listener", "Take care.", "Other")]
    dialogues = [{"experience_type": "Current Experience", "emotion_type": "depression",
                  "problem_type": "job crisis", "situation": f"case {i}",
                  "survey_score": {"seeker": {"initial_emotion_intensity": "5"}, "supporter": {}},
                  "dialog": [{"speaker": who, "annotation": {"strategy": st} if st else {},
                              "content": f"{text} ({i})\n"} for who, text, st in lines]}
                 for i in range(n)]
    path.write_text(json.dumps(dialogues), encoding="utf-8")
    return path


def test_import_of_the_failed_esconv_format_passes_check(tmp_path, capsys):
    """The importer on ESConv's failed-dialogue format, in a file written here."""
    _import_and_check(_failed_esconv_style(tmp_path / "failed_style.json"), 6, tmp_path, capsys)


@pytest.mark.reference
def test_import_of_the_published_failed_esconv_passes_check(tmp_path, capsys):
    """The real FailedESConv.json, 196 dialogues (`pytest --reference`)."""
    assert FAILED_ESCONV.is_file(), f"{FAILED_ESCONV}: missing (set PEER_RL_REFERENCE)"
    _import_and_check(FAILED_ESCONV, 196, tmp_path, capsys)


def _import_and_check(src, n_dialogues, tmp_path, capsys):
    out = tmp_path / "esconv_root"
    assert main(["data", "import-esconv", str(src), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{n_dialogues} dialogue(s) ->" in printed
    assert main(["data", "check", str(out)]) == 0
    rows = [json.loads(x) for x in (out / "grpo" / "esconv.jsonl").read_text().splitlines()]
    assert len(rows) >= n_dialogues
    assert all(r["history"] and r["history"][-1]["role"] == "seeker" for r in rows)
