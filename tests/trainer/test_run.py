"""`peer-rl train` as a user runs it: a fresh process with two rollout engines and the in-training
evaluation, the judge and the redundancy actor killed inside their step-2 calls, the run's whole
Ray cluster killed during step 3 (the driver left: the head node lost), then `resume=auto` to
step 3. A policy rank's death is tests/trainer/test_controller.py's."""
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from tracker_util import mlflow_history, wandb_history
from train_util import metrics as _metrics, train as _train, train_and_kill_the_cluster_after

from peer_rl.config.schema import load_config
from peer_rl.data.prompt_loader import PromptLoader
from peer_rl.trainer.run import load_prompts

pytestmark = pytest.mark.e2e


# pools scale independently (two rollout engines, their CPU share halved to fit 2 cores), and
# trainer.eval_freq evaluates through them: diversity via the rollout pool, safety judged by the
# reward-model pool's engine
# it also logs to W&B (offline) and MLflow (SQLite in the run dir) besides the JSONL
TRACKERS = ["trainer.loggers=[console,jsonl,tensorboard,wandb,mlflow]", "trainer.wandb.mode=offline"]
SCALED = ["trainer.total_steps=3", "rollout.num_workers=2", "resources.rollout.cpus_per_worker=0.25",
          "trainer.eval_freq=2", "eval.diversity_prompts=3", "eval.n=2", "eval.safety_probes=3",
          "eval.max_tokens=24", *TRACKERS]


# the judge's and the redundancy actor's processes SIGKILL themselves inside their second call
# (step 2's scoring; peer_rl.trainer.faults): Ray restarts them, the step redoes only their chunks
MID_STEP_KILLS = "UnifiRewardWorker.score@2,RedundancyWorker.similarities@2"
LOST_AFTER_S = 4          # the cluster's GCS silent this long: the run ends (ray.lost_after_s)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, grpo_models):
    """A 3-step run whose judge and redundancy actors die inside step 2 and whose Ray cluster
    (GCS, raylet, workers; SIGKILL) is lost during step 3."""
    out = tmp_path_factory.mktemp("train")
    faults = {"PEER_RL_FAULTS": MID_STEP_KILLS,
              "PEER_RL_FAULTS_DIR": str(tmp_path_factory.mktemp("faults"))}
    code, stdout, stderr, seconds = train_and_kill_the_cluster_after(
        out, grpo_models, 2, *SCALED, f"ray.lost_after_s={LOST_AFTER_S}", env=faults)
    assert code == 3, stdout[-2000:] + stderr[-4000:]
    # within the watch's bound (probes every 2 s; the trackers' close), well inside Ray's own
    # 60 s, after which its "Failed to connect to GCS" and exit 1 would have come instead
    assert seconds < LOST_AFTER_S + 30, seconds
    assert "Failed to connect to GCS" not in stderr
    last = stderr.strip().splitlines()[-1]
    ckpt = re.escape(str(out / "checkpoints" / "step_2"))
    assert re.fullmatch(r"error: the Ray cluster is gone: its GCS at [\d.]+:\d+ did not answer "
                        r"for \d+ s \(ray\.lost_after_s\) during step 3; nothing of step 3 is "
                        rf"kept\. Last complete checkpoint: {ckpt}\. Start the cluster again "
                        r"and rerun the same command with resume=auto to continue from it\.",
                        last), last
    assert "rollout x2" in stdout and "redundancy x1" in stdout and "[eval 2]" in stderr
    # a first run that reads cleanly (logging.verbose=false): no weight-loading bars from the
    # actors that load a model, no library deprecation warnings
    assert "Loading weights" not in stdout + stderr
    assert "Loading safetensors checkpoint shards" not in stdout + stderr
    assert "DeprecationWarning" not in stdout + stderr
    (out / "console.txt").write_text(stdout + stderr, encoding="utf-8")   # for the logs test
    return out


def test_killed_run_kept_complete_steps_metrics_and_checkpoints(run_dir):
    recs = _metrics(run_dir)
    assert [r["step"] for r in recs] == [1, 2]
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    for m in recs:
        # the step's logged figures worked out again from its samples: the means, and GRPO's
        # advantages as (r~ - group mean) / (unbiased group std + 1e-6) over each prompt's G
        step = [s for s in samples if s["step"] == m["step"]]
        assert m["reward/mean"] == pytest.approx(np.mean([s["reward"] for s in step]))
        final = np.array([s["reweighted_reward"] for s in step])
        assert m["reward/rur_mean"] == pytest.approx(final.mean())
        uids = np.array([s["uid"] for s in step])
        adv = np.concatenate([(final[uids == u] - final[uids == u].mean())
                              / (final[uids == u].std(ddof=1) + 1e-6) for u in np.unique(uids)])
        assert m["advantages/max"] == pytest.approx(adv.max(), abs=1e-4)
        assert m["advantages/min"] == pytest.approx(adv.min(), abs=1e-4)
        # the rest: what each metric must satisfy, whatever the tiny models wrote
        assert 0 <= m["reward/mean"] <= 3 and 0 <= m["judge/parse_failure_rate"] <= 1
        for k in ("rur/tau/mean", "rur/s_hist/mean", "rur/s_group/mean", "actor/pg_clipfrac",
                  "response/distinct_2", "reward/format_rate"):
            assert 0 <= m[k] <= 1, k
        # group-normalised advantages have mean 0 within every group, so over the batch too
        assert abs(m["advantages/mean"]) < 1e-5
        assert m["actor/kl_loss"] >= 0 and m["actor/entropy"] > 0
        assert m["response/length_mean"] > 0 and m["rollout/tokens_per_s"] > 0
        stages = sum(m[f"timing_s/{k}"] for k in ("rollout", "judge", "redundancy", "update", "sync"))
        assert all(m[f"timing_s/{k}"] > 0 for k in ("rollout", "judge", "redundancy", "update",
                                                  "sync"))
        assert m["timing_s/controller"] >= 0 and stages <= m["timing_s/step"] + 1e-6
    assert (run_dir / "config.yaml").exists()
    for step in (1, 2):
        ck = run_dir / "checkpoints" / f"step_{step}"
        assert (ck / "trainer_state.json").exists()
        assert (ck / "policy" / "model" / "model.safetensors").exists()
    assert not (run_dir / "checkpoints" / "step_3").exists()
    assert not (run_dir / "final").exists()          # exported only when the run completes
    # the figures drawn after the step-2 checkpoint: a run that dies has them
    for name in ("curves.png", "timeline.png"):
        assert (run_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_judge_and_redundancy_actors_killed_mid_step_are_restarted_and_the_step_counts_once(
        run_dir):
    console = (run_dir / "console.txt").read_text(encoding="utf-8")
    # inside the call (the actor died under it), not between calls
    assert "reward_model worker 0 died during step 2" in console
    assert "redundancy worker 0 died during step 2" in console
    recs = _metrics(run_dir)
    assert [r["faults/actor_restarts"] for r in recs] == [0, 2]
    # step 2 is whole: every sample judged and reweighted once (B x G rows, none twice)
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    step2 = [s for s in samples if s["step"] == 2]
    assert len(step2) == len([s for s in samples if s["step"] == 1]) == 4 * 4
    assert recs[1]["reward/mean"] == pytest.approx(sum(s["reward"] for s in step2) / 16)


def test_the_in_training_evaluation_is_logged_at_eval_freq(run_dir):
    """Which steps carry `eval/...` figures, in range, every safety verdict parsed. That the
    figures come from the pools' own answers is shown by
    tests/evaluation/test_in_training.py (a hand-counted distinct-n over the pool's replies)."""
    recs = _metrics(run_dir)
    assert not any(k.startswith("eval/") for k in recs[0])          # eval_freq=2: step 2 only
    m = recs[1]
    assert 0 < m["eval/diversity/distinct_1"] <= 1 and 0 < m["eval/diversity/distinct_2"] <= 1
    assert -1 <= m["eval/diversity/self_similarity"] <= 1
    # the judge pool answers the safety rubric in its JSON schema: every verdict parses, one
    # probe of each group (round-robin over the groups)
    assert m["eval/safety/unparsed"] == 0 and 0 <= m["eval/safety/pass_rate"] <= 1
    assert {k for k in m if k.endswith("pass_rate") and k.startswith("eval/safety/")} == {
        "eval/safety/pass_rate", "eval/safety/crisis_pass_rate",
        "eval/safety/harmful_request_pass_rate", "eval/safety/boundary_pass_rate"}


def test_no_dialogue_text_or_generation_reaches_the_console(run_dir):
    """Dialogue text, generations and judge answers go to samples.jsonl (log_samples=true
    here) and nowhere else: not one seeker utterance of the run's prompts, reply or judge
    answer of 24+ characters appears in what the run printed."""
    from peer_rl.data.loading import load_subset
    from peer_rl.data.bundled import sample_root

    console = (run_dir / "console.txt").read_text(encoding="utf-8")
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    ids = {s["prompt_id"] for s in samples}
    rows = [r for r in load_subset(sample_root(), "grpo", "*").dataset if r["id"] in ids]
    texts = [t["content"] for r in rows for t in r["history"]] + [s["text"] for s in samples]
    texts += [a for s in samples for a in (s["judge"] or []) if a]
    pieces = {t.strip()[:60] for t in texts if len(t.strip()) >= 24}
    assert len(rows) == len(ids) and len(pieces) > 20
    leaked = [p for p in pieces if p in console]
    assert not leaked, leaked[:3]


def test_logged_rur_factors_combine_by_the_formula_per_sample(run_dir):
    """Bookkeeping: each sample's logged r~ is its logged r, tau, s_hist and s_group combined
    by RUR's formula. That the factors themselves are right (tau from the reply's length,
    similarities from the embedder) is shown by tests/trainer/test_controller.py::
    test_rur_on_and_off_differ_exactly_as_the_formula, which recomputes them."""
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert any(s["reward"] > 0 for s in samples)
    for s in samples:
        expected = s["reward"] / ((1 + s["tau"] * s["s_hist"]) * (1 + s["tau"] * s["s_group"]))
        assert s["reweighted_reward"] == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_resume_auto_after_the_kill_continues_with_the_same_data_order(run_dir, grpo_models,
                                                                       tmp_path):
    # a copy of the killed run of its own: the module's other tests read run_dir as the kill
    # left it, in whatever order they run
    run_dir = Path(shutil.copytree(run_dir, tmp_path / "run"))
    proc = _train(run_dir, grpo_models, "trainer.total_steps=3", "resume=auto", *TRACKERS)
    assert "resuming from" in proc.stdout and "step_2" in proc.stdout
    assert [r["step"] for r in _metrics(run_dir)] == [1, 2, 3]  # none duplicated or missing
    # W&B and MLflow, read back by their own readers, hold metrics.jsonl's numbers: the killed
    # run's steps and the resumed run's, in the same tracker runs
    want = {r["step"]: {k: float(v) for k, v in r.items() if k != "step"
                        and isinstance(v, (int, float)) and not isinstance(v, bool)}
            for r in _metrics(run_dir)}
    assert len(want[3]) > 40
    ids = json.loads((run_dir / "trackers.json").read_text())
    assert wandb_history(run_dir) == want
    assert mlflow_history(f"sqlite:///{run_dir / 'mlflow.db'}", ids["mlflow"]) == want
    assert "[peer-rl] mlflow: continuing run " + ids["mlflow"] in proc.stdout
    assert (run_dir / "curves.png").exists()
    assert (run_dir / "checkpoints" / "step_3" / "trainer_state.json").exists()
    # the final policy as a plain HF directory: the step-3 weights, loadable by transformers
    from transformers import AutoConfig
    final, ck = run_dir / "final", run_dir / "checkpoints" / "step_3" / "policy" / "model"
    assert f"(policy, HF format: {final})" in proc.stdout
    assert AutoConfig.from_pretrained(final).model_type == AutoConfig.from_pretrained(ck).model_type
    assert (final / "model.safetensors").read_bytes() == (ck / "model.safetensors").read_bytes()
    assert not (run_dir / "final.tmp").exists()
    # the instruction it was trained on travels with it: what the evaluations will ask
    from peer_rl.prompts.policy import PolicyTemplate
    assert "policy prompt (built-in): 304/304 training prompt(s)" in proc.stdout
    assert PolicyTemplate.load(final) == PolicyTemplate.load(ck) == PolicyTemplate()
    assert (final / "policy_template.json").exists()
    # step 3 saw exactly the prompts an uninterrupted run would have seen
    cfg = load_config([f"trainer.output_dir={run_dir}"])
    pool = json.loads((run_dir / "checkpoints" / "step_3" / "prompts.json").read_text())["ids"]
    assert pool == [r["id"] for r in load_prompts(cfg)]      # the run's pool, saved in order
    loader = PromptLoader(load_prompts(cfg), cfg.data.train_batch_size, cfg.data.seed)
    expected = [[r["id"] for r in loader.next_batch()] for _ in range(3)]
    seen = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        seen.setdefault(s["step"], [])
        if s["prompt_id"] not in seen[s["step"]]:
            seen[s["step"]].append(s["prompt_id"])
    assert [seen[k] for k in (1, 2, 3)] == expected
