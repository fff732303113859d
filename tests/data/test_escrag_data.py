"""ESC-Preference pairs and the exemplar corpus: validated like the PEER subsets."""
import json

from peer_rl.data.layout import discover
from peer_rl.data.sample import sample_root
from peer_rl.data.validate import check_file


def _check(tmp_path, subset, rows):
    d = tmp_path / subset
    d.mkdir()
    (d / "x.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    [df] = [f for f in discover(tmp_path) if f.subset == subset]
    return check_file(df)


HIST = [{"speaker": "seeker", "content": "I failed again."},
        {"speaker": "supporter", "content": "That's hard."},
        {"speaker": "seeker", "content": "Yeah."}]


def test_pairs_load_with_any_history_spelling_and_optional_scores(tmp_path):
    rep = _check(tmp_path, "preference", [
        {"id": 1, "language": "english", "history": HIST, "chosen": "a", "rejected": "b",
         "scores": {"chosen": {"client": 8.5, "counselor": 9, "judge": 8},
                    "rejected": {"client": 3, "counselor": 4, "judge": 2}}},
        {"id": "p2", "language": "zh", "history": ["我又没考上。"], "chosen": "c", "rejected": "d"}])
    assert not rep.problems
    assert rep.rows[0]["id"] == "1" and rep.rows[0]["language"] == "en"
    assert rep.rows[0]["history"][-1] == {"role": "seeker", "content": "Yeah."}
    assert rep.rows[0]["scores"]["chosen"]["counselor"] == 9


def test_bad_pairs_name_line_and_field(tmp_path):
    path = tmp_path / "preference" / "x.jsonl"
    rep = _check(tmp_path, "preference", [
        {"id": 1, "language": "en", "history": HIST, "chosen": "same", "rejected": "same"},
        {"id": 2, "language": "en", "history": HIST[:2], "chosen": "a", "rejected": "b"},
        {"id": 3, "language": "en", "history": HIST, "chosen": "a", "rejected": "b",
         "scores": {"chosen": {"client": 11}}},
        {"id": 4, "language": "en", "history": HIST, "chosen": "a"}])
    msgs = [str(p) for p in rep.problems]
    assert f"{path}:1: rejected: expected a reply different from chosen" in msgs
    assert any(m.startswith(f"{path}:2: history: expected the last turn to be the seeker's")
               for m in msgs)
    assert any(m.startswith(f"{path}:3: scores: expected an object") for m in msgs)
    assert any(m.startswith(f"{path}:4: rejected: missing") for m in msgs)
    assert rep.n_invalid == 4


def test_exemplars_need_a_response_and_an_id(tmp_path):
    rep = _check(tmp_path, "exemplars", [
        {"id": "e1", "language": "en", "history": HIST, "response": "r", "strategy": "Question"},
        {"language": "en", "history": HIST, "response": "r"},
        {"id": "e3", "language": "en", "history": HIST, "response": ""}])
    assert rep.n_invalid == 2 and rep.rows[0]["strategy"] == "Question"


def test_the_sample_pairs_and_exemplars_keep_test_dialogues_out_of_the_index():
    root = sample_root()
    [ex] = [f for f in discover(root) if f.subset == "exemplars"]
    pref = {f.path.stem: check_file(f).rows for f in discover(root) if f.subset == "preference"}
    ex_rows = check_file(ex).rows
    test_dialogues = {r["id"].rsplit("-t", 1)[0] for r in pref["test"]}
    assert test_dialogues and not any(r["id"].rsplit("-t", 1)[0] in test_dialogues for r in ex_rows)
    assert {r["language"] for r in ex_rows} == {"en", "zh"}
    assert all(r["chosen"] != r["rejected"] for rows in pref.values() for r in rows)


def test_eval_pairs_names_a_bad_pair_before_starting_an_engine(tmp_path, capsys):
    from peer_rl.cli import main

    (tmp_path / "preference").mkdir()
    (tmp_path / "preference" / "test.jsonl").write_text(
        '{"id": 1, "language": "en", "history": ["hi"], "chosen": "a"}\n')
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert main(["eval", "pairs", "--model", str(model), "--data", str(tmp_path),
                 "--out", str(tmp_path / "r.json")]) == 2
    assert "test.jsonl:1: rejected: missing" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
