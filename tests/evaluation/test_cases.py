"""Evaluation inputs in the benchmarks' published shapes; bad items name file, item and field."""
import json
import os
from pathlib import Path

import pytest

from peer_rl.evaluation.cases import (CaseFileError, load_diversity_prompts, load_probes,
                                      load_profiles, load_role_cards)
from peer_rl.evaluation.config import SAMPLE_EVAL

# published benchmark files, read only under --reference from $PEER_RL_REFERENCE
REFERENCE = Path(os.environ.get("PEER_RL_REFERENCE", "PEER_RL_REFERENCE-is-not-set"))


def test_role_cards_as_esc_eval_publishes_them(tmp_path):
    cards = [{"base": "Age: 30\nProblem: exams", "res": "学业", "source": "ESconv",
              "base_biaozhu": "年龄：30", "language": "english", "id": 32025},
             {"base": "年龄：青年\n问题：相亲压力", "res": "家庭生活", "source": "PsyQA",
              "base_biaozhu": "年龄：青年", "language": "chinese", "id": 10000}]
    path = tmp_path / "cards.json"
    path.write_text(json.dumps(cards, ensure_ascii=False))
    got = load_role_cards(path).items
    assert [(c.id, c.language) for c in got] == [("32025", "en"), ("10000", "zh")]
    assert got[1].base.startswith("年龄：青年")


def test_bad_cards_name_the_item_and_field_and_skip_invalid_counts_them(tmp_path):
    path = tmp_path / "cards.json"
    path.write_text(json.dumps([{"id": 1, "base": "ok", "language": "english"},
                                {"id": 2, "base": "", "language": "english"},
                                {"id": 3, "base": "b", "language": "french"},
                                {"id": 1, "base": "dup", "language": "chinese"}]))
    with pytest.raises(CaseFileError) as err:
        load_role_cards(path)
    msg = str(err.value)
    assert f"{path}:item 2: base: expected a non-empty string" in msg
    assert f"{path}:item 3: language: expected english or chinese" in msg
    assert f"{path}:item 4: id: '1' repeats {path}:item 1" in msg
    loaded = load_role_cards(path, skip_invalid=True)
    assert [c.id for c in loaded.items] == ["1"] and len(loaded.skipped) == 3


def test_sage_profiles_infer_their_language(tmp_path):
    rows = [{"id": "d3c3", "player": "* 姓名：王小云", "scene": "剧本", "main_cha": "负面型",
             "cha_group": ["愤怒"], "task": "你想分析原因", "first_talk": "最近有些事搞得我头大。"},
            {"id": "e1", "player": "* Name: Sam", "scene": "story", "task": "be seen",
             "first_talk": "Well, my wife is sick."}]
    path = tmp_path / "profiles.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n{oops\n")
    with pytest.raises(CaseFileError, match=r"profiles.jsonl:3: not valid JSON"):
        load_profiles(path)
    got = load_profiles(path, skip_invalid=True).items
    assert [(p.id, p.language) for p in got] == [("d3c3", "zh"), ("e1", "en")]


def test_the_bundled_cards_and_profiles_load_whole():
    assert len(load_role_cards(SAMPLE_EVAL / "esc_cards.json").items) == 4
    assert {p.language for p in load_profiles(SAMPLE_EVAL / "sage_profiles.jsonl").items} \
        == {"en", "zh"}


@pytest.mark.reference
def test_the_published_esc_eval_cards_and_sage_profiles_load_whole():
    """Every item of the published files (`pytest --reference`, files under
    $PEER_RL_REFERENCE)."""
    cards = REFERENCE / "esc-eval" / "card_high_en.json"
    profiles = REFERENCE / "sage" / "simulator_profile_withfirsttalk.jsonl"
    for f in (cards, profiles):
        assert f.is_file(), f"{f}: missing (set PEER_RL_REFERENCE to the reference data)"
    assert len(load_role_cards(cards).items) == len(json.loads(cards.read_text()))
    assert len(load_profiles(profiles).items) == 100


def test_probes_and_diversity_prompts_come_from_the_peer_layout():
    from peer_rl.data.bundled import sample_root

    probes = load_probes(sample_root()).items
    assert {p.group for p in probes} == {"crisis", "harmful_request", "boundary"}
    assert all(p.history and p.language in ("en", "zh") for p in probes)
    prompts = load_diversity_prompts(sample_root(), "visual_test").items
    assert prompts and all(len(p.images) == 2 and Path(p.images[0]).is_file() for p in prompts)
