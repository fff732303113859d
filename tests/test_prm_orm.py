"""PEER's reward-model comparison end to end: a separate process model (PRM) and outcome model
(ORM) trained on the same SER rows as UnifiReward, scored by `eval rm` beside it, and used as
GRPO's reward (`reward_model.kind=prm_orm`)."""
import json
import subprocess
import sys

import pytest
from train_util import metrics, train

pytestmark = [pytest.mark.e2e, pytest.mark.long]   # ~3 min: two train-rm runs, a GRPO run


# the SER labels' vocabulary (the sample's English and Chinese verdict turns), read by exact
# string: an oracle independent of peer-rl's lenient parsers
STEP = {"True": True, "False": False, "正确": True, "错误": False}
PREF = {"The first sentence is better": "first", "第一句更好": "first",
        "The second sentence is better": "second", "第二句更好": "second",
        "The two sentences are almost good": "tie", "差不多": "tie",
        "Neither sentence is available": "neither", "都不可用": "neither"}


def _start_train_rm(recipe, out, judge) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "peer_rl.cli", "train-rm", f"recipe={recipe}",
                             f"model.path={judge}", f"trainer.output_dir={out}",
                             "trainer.total_steps=24", "trainer.world_size=1",
                             "trainer.save_freq=0", "resources.cpus_per_worker=1",
                             "ray.address=local"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finished(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def pair(tiny_models, tmp_path_factory):
    """The two stages trained side by side, as two users' jobs would be: each its own process
    and local Ray cluster (their start-ups overlap instead of adding up), one thread each
    (resources.cpus_per_worker=1: two on two cores, not four)."""
    root = tmp_path_factory.mktemp("pair")
    started = {name: _start_train_rm(f"{name}_tiny", root / name, tiny_models["judge"])
               for name in ("prm", "orm")}
    try:
        logs = {name: _finished(proc) for name, proc in started.items()}
    finally:
        for proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert "all 304 SER row(s) match" in logs["prm"].stderr + logs["prm"].stdout
    return {"prm": root / "prm" / "final", "orm": root / "orm" / "final",
            "logs": (logs["prm"], logs["orm"])}


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
    # the inconsistency worked out again from the raw answers and the rows' labels, read with
    # the SER vocabulary's exact strings (not peer-rl's parsers): a sample splits when its three
    # steps are all judged as labelled but its preference is not, or the other way round
    from peer_rl.data.bundled import sample_root

    rows = {}
    for f in sorted((sample_root() / "ser").glob("*/*_test.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            rows[str(r["id"])] = r
    split = strict = 0
    for s in report["samples"]:
        msgs = rows[s["id"]]["messages"]
        labels = [STEP.get(msgs[i]["content"]) for i in (2, 4, 6)] + [PREF.get(msgs[8]["content"])]
        preds = [STEP.get(a.strip()) for a in s["answers"][:3]] + [PREF.get(s["answers"][3].strip())]
        assert None not in labels
        strict += None not in preds
        steps_right = preds[:3] == labels[:3]
        split += steps_right != (preds[3] == labels[3])
    assert strict >= 10                 # the trained pair answers in the vocabulary
    assert m["inconsistency"] == pytest.approx(split / 12)
    # swapped slots are refused before any row is judged
    assert main(["eval", "rm", "--prm", str(pair["orm"]), "--orm", str(pair["prm"]),
                 "--out", str(tmp_path / "x.json"), "--limit", "2"]) == 2
    assert "has role 'outcome', expected 'process'" in capsys.readouterr().err


def test_grpo_can_take_the_pair_as_its_reward(pair, tiny_models, tmp_path):
    """Each sample's reward is PEER's, worked out here from the logged answers: 0.5 a step the
    PRM calls true, 0.5 when the ORM prefers the candidate or calls it a tie (the candidate shown
    first where the step's coin, numpy's default_rng([trainer.seed, step - 1]), drew < 0.5), 1
    for a complete format. A run that ignored the ORM's preference would miss the 0.5s."""
    tiny = {"policy": tiny_models["policy"], "judge": str(pair["prm"])}
    out = tmp_path / "run"
    train(out, tiny, "trainer.total_steps=1", "reward_model.kind=prm_orm",
          f"reward_model.outcome_path={pair['orm']}")
    [m] = metrics(out)
    assert 0 <= m["judge/inconsistency_rate"] <= 1
    import numpy as np

    from peer_rl.prompts.reasoning import format_complete

    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 16
    first = np.random.default_rng([0, 0]).random(16) < 0.5      # trainer.seed 0, step 1
    assert any(first) and not all(first)
    checked = preferred = 0
    for s, cand_first in zip(samples, first):
        answers = [(a or "").strip() for a in s["judge"]]
        # a step the policy did not write is not asked (logged "") and scores 0; so does an
        # empty answer
        steps = [False if not a else STEP.get(a) for a in answers[:3]]
        pref = "none" if not answers[3] else PREF.get(answers[3])
        if None in steps or pref is None:
            continue                    # outside the vocabulary: the parsers' business
        ok = {"tie": True, "neither": False, "none": False, "first": bool(cand_first),
              "second": not cand_first}[pref]
        preferred += ok
        checked += 1
        fmt = 1.0 if format_complete(s["text"]) else 0.0
        assert s["reward"] == pytest.approx(0.5 * sum(steps) + 0.5 * ok + fmt), s
    assert checked >= 12 and preferred >= 1
