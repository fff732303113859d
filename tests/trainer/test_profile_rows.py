"""The seekers a dialogue run trains with (peer_rl.trainer.profile_rows): the bundled SAGE sample
and ESC-Eval role cards (written here in the benchmark's published shape) as rows, data.languages,
and a bad file refused naming the key, the file and the line."""
import json

import pytest

from peer_rl.config.schema import load_config
from peer_rl.data.prompt_loader import PromptPoolError
from peer_rl.evaluation.cases import CaseFileError
from peer_rl.trainer.profile_rows import profile_rows


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


CARDS = [{"id": 7, "base": "Age: 30\nProblem: lost her job", "language": "english",
          "res": "work", "source": "ESconv"},
         {"id": 8, "base": "年龄：40\n问题：失眠", "language": "chinese"}]


def test_esc_eval_role_cards_are_seekers_without_a_first_message(tmp_path):
    cards = tmp_path / "card_high.json"
    cards.write_text(json.dumps(CARDS, ensure_ascii=False))
    rows = profile_rows(load_config(["recipe=dialogue_tiny", f"dialogue.profiles={cards}"]))
    assert [(r["id"], r["language"], r["opening"], r["source"]) for r in rows] == \
        [("7", "en", None, "esc_eval"), ("8", "zh", None, "esc_eval")]
    # the persona is the card, rendered as `eval esc` renders it
    assert "Problem: lost her job" in rows[0]["persona"] and "失眠" in rows[1]["persona"]
    english = profile_rows(load_config(["recipe=dialogue_tiny", f"dialogue.profiles={cards}",
                                        "data.languages=[english]"]))
    assert [r["id"] for r in english] == ["7"]


def test_data_languages_keeps_the_profiles_of_those_languages_and_refuses_none_left(tmp_path):
    rows = profile_rows(load_config(["recipe=dialogue_tiny", "data.languages=[chinese]"]))
    assert [r["id"] for r in rows] == ["sample-zh-1", "sample-zh-2"]
    cards = tmp_path / "cards.json"
    cards.write_text(json.dumps(CARDS[:1]))
    with pytest.raises(PromptPoolError, match=r"holds no seeker in data.languages=\['chinese'\] "
                                              r"\(it holds \{'en': 1\}\)"):
        profile_rows(load_config(["recipe=dialogue_tiny", f"dialogue.profiles={cards}",
                                  "data.languages=[chinese]"]))


def test_a_file_of_neither_kind_is_refused_naming_what_each_kind_holds(tmp_path):
    other = tmp_path / "rows.jsonl"
    other.write_text('{"id": "1", "history": []}\n')
    with pytest.raises(PromptPoolError, match=r"dialogue.profiles: .*rows.jsonl: expected SAGE "
                                              r"profiles .* or ESC-Eval role cards .*"
                                              r"first item has \['history', 'id'\]"):
        profile_rows(load_config(["recipe=dialogue_tiny", f"dialogue.profiles={other}"]))
    card = tmp_path / "card.json"
    card.write_text('[{"id": 1, "base": "x", "language": "klingon"}]')
    with pytest.raises(CaseFileError, match=r"card.json:item 1: language: expected english"):
        profile_rows(load_config(["recipe=dialogue_tiny", f"dialogue.profiles={card}"]))


def _personas(d, records):
    """A `peer-rl data personas` output, as that job writes its personas.jsonl."""
    d.mkdir()
    (d / "personas.jsonl").write_text("".join(json.dumps(
        {"seeker": sid, "language": lang, "cluster": f"{lang}-0", "rows": [],
         "disc": {"dominance": 2, "influence": 4, "steadiness": 3, "compliance": 2},
         "description": text}, ensure_ascii=False) + "\n" for sid, lang, text in records))
    return d


def test_dialogue_personas_add_how_each_seeker_talks_in_its_language(tmp_path):
    d = _personas(tmp_path / "p", [("s1", "en", "Talks in short bursts."),
                                   ("s2", "en", "Apologises a lot."),
                                   ("s3", "zh", "说话很委婉。")])
    plain = profile_rows(load_config(["recipe=dialogue_tiny"]))
    rows = profile_rows(load_config(["recipe=dialogue_tiny", f"dialogue.personas={d}"]))
    for r, p in zip(rows, plain):
        # who the seeker is stays; how it talks comes after, from a persona of its language
        assert r["persona"].startswith(p["persona"]) and r["opening"] == p["opening"]
        assert r["style"] in ({"s3"} if r["language"] == "zh" else {"s1", "s2"})
    assert rows[0]["persona"].endswith("说话很委婉。")
    assert "How you talk" in rows[2]["persona"]
    # drawn by the seeker's id and the seed: the same again, and the seed can change it
    again = profile_rows(load_config(["recipe=dialogue_tiny", f"dialogue.personas={d}"]))
    assert again == rows
    draws = {profile_rows(load_config(["recipe=dialogue_tiny", f"dialogue.personas={d}",
                                       f"trainer.seed={s}"]))[2]["style"] for s in range(8)}
    assert draws == {"s1", "s2"}


def test_dialogue_personas_without_the_seekers_language_or_the_file_are_refused(tmp_path):
    d = _personas(tmp_path / "p", [("s1", "en", "Talks in short bursts.")])
    with pytest.raises(PromptPoolError, match=r"no persona in \['zh'\] for the seekers in it "
                                              r"\(it holds \['en'\]\)"):
        profile_rows(load_config(["recipe=dialogue_tiny", f"dialogue.personas={d}"]))
    with pytest.raises(PromptPoolError, match=r"dialogue.personas=.*none: no personas.jsonl"):
        profile_rows(load_config(["recipe=dialogue_tiny",
                                  f"dialogue.personas={tmp_path / 'none'}"]))
    (d / "personas.jsonl").write_text('{"seeker": "s1"}\n')
    with pytest.raises(PromptPoolError, match=r"personas.jsonl:1: expected a persona record"):
        profile_rows(load_config(["recipe=dialogue_tiny", f"dialogue.personas={d}"]))
