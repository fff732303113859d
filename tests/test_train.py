"""`peer-rl train` as a user runs it: a fresh process, 2 steps, then `resume=auto` to step 3."""
import json
import os
import subprocess
import sys

import pytest

from peer_rl.config import load_config
from peer_rl.dataloader import PromptLoader
from peer_rl.train import load_prompts

pytestmark = pytest.mark.e2e


def _train(out, tiny, *extra, timeout=900):
    cmd = [sys.executable, "-m", "peer_rl.cli", "train", f"trainer.output_dir={out}",
           f"model.path={tiny['policy']}", f"reward_model.path={tiny['judge']}", "ray.address=local",
           "trainer.save_freq=1", "logging.log_samples=true", *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _metrics(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_models):
    out = tmp_path_factory.mktemp("train")
    proc = _train(out, tiny_models, "trainer.total_steps=2")
    assert f"output in {out}" in proc.stdout
    return out


def test_two_steps_write_metrics_config_and_checkpoints(run_dir):
    recs = _metrics(run_dir)
    assert [r["step"] for r in recs] == [1, 2]
    for key in ("reward/mean", "reward/rur_mean", "judge/parse_failure_rate", "rur/tau/mean",
                "rur/s_hist/mean", "rur/s_group/mean", "advantages/mean", "actor/kl_loss",
                "actor/clip_frac", "actor/entropy", "response/length_mean", "response/distinct_2",
                "timing/rollout", "timing/judge", "timing/redundancy", "timing/update",
                "timing/sync", "timing/controller", "rollout/tokens_per_s"):
        assert key in recs[0], key
    assert (run_dir / "config.yaml").exists()
    for step in (1, 2):
        ck = run_dir / "checkpoints" / f"step_{step}"
        assert (ck / "trainer_state.json").exists()
        assert (ck / "policy" / "model" / "model.safetensors").exists()
    assert not list((run_dir / "checkpoints").glob("*.tmp"))


def test_rur_rewards_follow_the_formula_per_sample(run_dir):
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        expected = s["reward"] / ((1 + s["tau"] * s["s_hist"]) * (1 + s["tau"] * s["s_group"]))
        assert s["final_reward"] == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_resume_auto_continues_with_the_same_data_order(run_dir, tiny_models):
    proc = _train(run_dir, tiny_models, "trainer.total_steps=3", "resume=auto")
    assert "resuming from" in proc.stdout and "step_2" in proc.stdout
    assert [r["step"] for r in _metrics(run_dir)] == [1, 2, 3]
    assert (run_dir / "checkpoints" / "step_3" / "trainer_state.json").exists()
    # step 3 saw exactly the prompts an uninterrupted run would have seen
    cfg = load_config([f"trainer.output_dir={run_dir}"])
    loader = PromptLoader(load_prompts(cfg), cfg.data.train_batch_size, cfg.data.seed)
    expected = [[r["id"] for r in loader.next_batch()] for _ in range(3)]
    seen = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        seen.setdefault(s["step"], [])
        if s["prompt_id"] not in seen[s["step"]]:
            seen[s["step"]].append(s["prompt_id"])
    assert [seen[k] for k in (1, 2, 3)] == expected
