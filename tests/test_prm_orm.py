"""PEER's reward-model comparison end to end: a separate process model (PRM) and outcome model
(ORM) trained on the same SER rows as UnifiReward, scored by `eval rm` beside it, and used as
GRPO's reward (`reward_model.kind=prm_orm`)."""
import json
import subprocess
import sys

import pytest
from train_util import metrics, train

pytestmark = [pytest.mark.e2e, pytest.mark.long]   # ~3 min: two train-rm runs, a GRPO run


def _train_rm(recipe, out, judge):
    proc = subprocess.run([sys.executable, "-m", "peer_rl.cli", "train-rm", f"recipe={recipe}",
                           f"model.path={judge}", f"trainer.output_dir={out}",
                           "trainer.total_steps=24", "trainer.world_size=1", "trainer.save_freq=0",
                           "resources.cpus_per_worker=2", "ray.address=local"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, out / "final"


@pytest.fixture(scope="module")
def pair(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    prm_proc, prm = _train_rm("prm_tiny", root / "prm", tiny_models["judge"])
    orm_proc, orm = _train_rm("orm_tiny", root / "orm", tiny_models["judge"])
    assert "all 304 SER row(s) match" in prm_proc.stderr + prm_proc.stdout
    return {"prm": prm, "orm": orm, "logs": (prm_proc, orm_proc)}


def test_each_judge_carries_its_role_and_its_training_time(pair):
    from peer_rl.prompts.judge import JudgeTemplate

    assert JudgeTemplate.load(pair["prm"]).role == "process"
    assert JudgeTemplate.load(pair["orm"]).role == "outcome"
    for name in ("prm", "orm"):
        t = json.loads((pair[name] / "train_time.json").read_text())
        assert t["steps"] == 24 and t["seconds"] > 0 and t["kind"] == name


def test_eval_rm_scores_the_pair_and_reports_inconsistency(pair, tmp_path, capsys):
    from peer_rl.cli import main

    out = tmp_path / "pair.json"
    assert main(["eval", "rm", "--prm", str(pair["prm"]), "--orm", str(pair["orm"]),
                 "--out", str(out), "--limit", "12"]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["judges"]["kind"] == "prm_orm" and report["n_unreadable"] == 0
    m = report["metrics"]["all"]
    assert m["n"] == 12 and 0 <= m["inconsistency"] <= 1
    assert "training time: process" in printed and "pair total" in printed
    # the inconsistency worked out again from the raw answers and the rows' labels
    from peer_rl.data.bundled import sample_root
    from peer_rl.evaluation.rm import Verdicts, ser_labels

    rows = {}
    for f in sorted((sample_root() / "ser").glob("*/*_test.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            rows[str(r["id"])] = r
    split = 0
    for s in report["samples"]:
        label, pred = ser_labels(rows[s["id"]]), Verdicts.parse(s["answers"])
        steps_right = all(p is not None and p == y for p, y in zip(pred.steps, label.steps))
        split += steps_right != (pred.preference == label.preference)
    assert m["inconsistency"] == pytest.approx(split / 12)
    # swapped slots are refused before any row is judged
    assert main(["eval", "rm", "--prm", str(pair["orm"]), "--orm", str(pair["prm"]),
                 "--out", str(tmp_path / "x.json"), "--limit", "2"]) == 2
    assert "has role 'outcome', expected 'process'" in capsys.readouterr().err


def test_grpo_can_take_the_pair_as_its_reward(pair, tiny_models, tmp_path):
    tiny = {"policy": tiny_models["policy"], "judge": str(pair["prm"])}
    out = tmp_path / "run"
    train(out, tiny, "trainer.total_steps=1", "reward_model.kind=prm_orm",
          f"reward_model.outcome_path={pair['orm']}")
    [m] = metrics(out)
    assert 0 <= m["reward/mean"] <= 3 and 0 <= m["judge/inconsistency_rate"] <= 1
    from peer_rl.reasoning import format_complete
    from peer_rl.rewards import parse_step_verdict

    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 16
    for s in samples:      # PEER's reward from the PRM's step verdicts, the ORM's preference
        rest = s["reward"] - 0.5 * sum(parse_step_verdict(a) is True for a in s["judge"][:3])
        assert min(abs(rest - v) for v in (0, 0.5, 1, 1.5)) < 1e-9
        assert (rest >= 1 - 1e-9) == format_complete(s["text"])
