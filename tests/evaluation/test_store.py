"""The run store: a killed run loses no finished case and counts none twice."""
import json

import pytest

from peer_rl.evaluation.store import RunMismatch, RunStore

MANIFEST = {"protocol": "esc", "settings": {"rounds": 5}, "parties": {"model": {"url": "u"}}}


def test_cases_survive_reopening(tmp_path):
    store = RunStore(tmp_path, MANIFEST)
    store.append({"id": "1", "score": 3})
    store.append({"id": "2", "score": 4})
    again = RunStore(tmp_path, MANIFEST)
    assert again.done("1") and again.done("2") and not again.done("3")
    assert again.records["2"] == {"id": "2", "score": 4}
    with pytest.raises(ValueError, match="already recorded"):
        again.append({"id": "1", "score": 0})


def test_a_line_cut_by_a_kill_is_dropped_and_its_case_redone(tmp_path):
    store = RunStore(tmp_path, MANIFEST)
    store.append({"id": "1"})
    with open(store.path, "a", encoding="utf-8") as fh:
        fh.write('{"id": "2", "turns": [{"seek')          # the process died mid-write
    again = RunStore(tmp_path, MANIFEST)
    assert again.torn_lines == 1 and list(again.records) == ["1"]
    again.append({"id": "2"})
    ids = [json.loads(x)["id"] for x in store.path.read_text().splitlines()]
    assert ids == ["1", "2"]


def test_a_damaged_line_in_the_middle_is_an_error_naming_it(tmp_path):
    store = RunStore(tmp_path, MANIFEST)
    store.path.write_text('{"id": "1"}\nnot json\n{"id": "3"}\n')
    with pytest.raises(ValueError, match=r"cases.jsonl:2: not a JSON line"):
        RunStore(tmp_path, MANIFEST)


def test_other_settings_are_refused_naming_what_differs(tmp_path):
    RunStore(tmp_path, MANIFEST)
    with pytest.raises(RunMismatch, match="settings differ"):
        RunStore(tmp_path, {**MANIFEST, "settings": {"rounds": 3}})
