"""Reports and `eval compare`: the papers' tables from run summaries, figures as PNG."""
import json

import pytest
from PIL import Image

from peer_rl.config.schema import ConfigError
from peer_rl.evaluation.config import load_eval_config
from peer_rl.evaluation.prompts import DIMENSIONS
from peer_rl.evaluation.report import compare_runs, mean_trajectory, write_report


def _esc_summary(score):
    dims = {d: {"mean": score, "scaled": score * 25, "n": 2, "unparsed": 0} for d in DIMENSIONS}
    return {"protocol": "esc", "cases": 2, "errors": 0, "error_ids": [], "dimensions": dims,
            "average": score, "average_scaled": score * 25, "judge_unparsed": 0,
            "format_rate": 1.0, "by_language": {}}


def _sage_summary(trajs):
    finals = [t[-1] for t in trajs.values()]
    return {"protocol": "sage", "cases": len(trajs), "errors": 0, "error_ids": [],
            "sentient_score": sum(finals) / len(finals), "success_rate": 0.5,
            "bands": {"S": 1, "A": 0, "B": 1, "C": 0, "F": 0}, "ends": {"success": 1},
            "mean_turns": 2.0, "change_unparsed": 0, "changes_asked": 4, "trajectories": trajs}


def _manifest(path, prompt="peer"):
    return {"protocol": "x", "parties": {"model": {"path": path, "prompt": prompt}}}


def test_mean_trajectory_holds_the_last_value_of_ended_dialogues():
    assert mean_trajectory({"a": [40, 50, 60], "b": [40, 30]}) == [40, 40, 45]


def test_compare_puts_models_side_by_side_on_the_100_scale(tmp_path):
    runs = []
    for name, score in (("rur_on", 3.5), ("rur_off", 2.0)):
        d = tmp_path / name
        d.mkdir()
        write_report(d, _esc_summary(score), _manifest(f"/ckpt/{name}"))
        runs.append(d)
    sage = tmp_path / "sage"
    sage.mkdir()
    write_report(sage, _sage_summary({"p1": [40, 70, 100], "p2": [40, 45]}), _manifest("/ckpt/x"))
    md = compare_runs(runs + [sage], tmp_path / "cmp", names=["RUR", "no RUR", "RUR"])
    text = md.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| RUR |"))
    assert row.count("87.50") == 8                # 7 dimensions + the average
    assert "| no RUR | 50.00 |" in text
    assert "| RUR | 72.50 | 50.0% | 1 | 0 | 1 | 0 | 0 | 2.0 | 2 |" in text
    for png in ("compare_esc_dimensions.png", "compare_sage_trajectories.png"):
        assert Image.open(tmp_path / "cmp" / png).size == (820, 440)
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["esc"]["no RUR"][
        "average_scaled"] == 50.0


def test_a_run_directory_without_a_report_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no report.json"):
        compare_runs([tmp_path], tmp_path / "cmp")


def test_eval_config_names_the_missing_party_and_bad_values():
    with pytest.raises(ConfigError, match=r"judge: set exactly one of judge.url"):
        load_eval_config("esc", ["model.path=/m", "seeker.path=/m"])
    with pytest.raises(ConfigError, match=r"model.prompt='steps'"):
        load_eval_config("diversity", ["model.path=/m", "model.prompt=steps"])
    with pytest.raises(ConfigError, match=r"seeker.url='localhost:8000'"):
        load_eval_config("sage", ["model.path=/m", "seeker.url=localhost:8000"])
    with pytest.raises(ConfigError, match=r"judge.temprature"):
        load_eval_config("safety", ["model.path=/m", "judge.path=/m", "judge.temprature=0"])
    assert load_eval_config("diversity", ["model.path=/m"]).diversity.n == 4


def test_a_judge_that_gives_one_score_to_everything_is_called_out(tmp_path):
    """14 scores of 0 (two dialogues x 7 dimensions) rank nothing: the report says so; a judge
    whose scores vary gets their spread and no warning; a SAGE seeker likewise."""
    flat, varied, sage = tmp_path / "flat", tmp_path / "varied", tmp_path / "sage"
    for d in (flat, varied, sage):
        d.mkdir()
    write_report(flat, {**_esc_summary(0), "judge_scores": {"0": 14}}, _manifest("/ckpt/a"))
    write_report(varied, {**_esc_summary(1), "judge_scores": {"0": 7, "2": 7}},
                 _manifest("/ckpt/b"))
    write_report(sage, {**_sage_summary({"p1": [40, 40], "p2": [40, 40]}), "changes": {"0": 4}},
                 _manifest("/ckpt/c"))
    text = (flat / "report.md").read_text()
    assert "- scores given (value: count): 0: 14" in text
    assert "the judge gave the same score (0) all 14 times" in text
    text = (varied / "report.md").read_text()
    assert "- scores given (value: count): 0: 7, 2: 7" in text and "same score" not in text
    assert "the seeker reported the same emotion change (0) all 4 times" in \
        (sage / "report.md").read_text()
    md = compare_runs([flat, varied], tmp_path / "cmp", names=["A", "B"]).read_text()
    assert "- A: the judge gave the same score (0) all 14 times" in md and "- B:" not in md
    # a report written before the counts existed: no counts, no warning
    old = tmp_path / "old"
    old.mkdir()
    write_report(old, _esc_summary(0), _manifest("/ckpt/d"))
    assert "given (value: count)" not in (old / "report.md").read_text()
