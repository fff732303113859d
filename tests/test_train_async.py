"""`peer-rl train` with trainer.async_training.staleness=1 in a fresh process: the next step's
rollout, judging and redundancy run inside this step's update, every trained sample is one update
old (checked by the policy against the engines' stamps), a policy rank killed during step 3, then
`resume=auto` trains each batch exactly once, in the uninterrupted order."""
import json

import pytest
from train_util import metrics, train, train_and_kill_a_policy_rank_after

from peer_rl.config import load_config
from peer_rl.dataloader import PromptLoader
from peer_rl.train import load_prompts

pytestmark = pytest.mark.e2e

ASYNC = ["trainer.total_steps=3", "trainer.async_training.staleness=1"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, grpo_models):
    out = tmp_path_factory.mktemp("train_async")
    code, stdout, stderr = train_and_kill_a_policy_rank_after(out, grpo_models, 2, *ASYNC)
    assert code == 3, stdout[-2000:] + stderr[-4000:]
    assert "a policy rank died during step 3" in stderr
    return out


def _spans(out) -> dict:
    lines = (out / "timeline.jsonl").read_text().splitlines()
    return {(s["step"], s["stage"]): s for s in map(json.loads, lines)}


def test_samples_are_one_update_old_and_were_drawn_during_the_previous_update(run_dir):
    recs = metrics(run_dir)
    assert [r["step"] for r in recs] == [1, 2]
    # step 1 was sampled by the initial policy; step 2 during update 1, by the same weights
    assert recs[0]["async/staleness_max"] == 0.0
    assert recs[1]["async/staleness_max"] == recs[1]["async/staleness_mean"] == 1.0
    assert 0.0 < recs[1]["async/behavior_weight_mean"] <= 2.0
    spans = _spans(run_dir)
    # step 2's rollout began inside update 1 and ended before update 1's weights were synced
    update, ahead = spans[(1, "update")], spans[(2, "rollout")]
    assert update["start"] <= ahead["start"] < update["end"]
    assert ahead["end"] <= spans[(1, "sync")]["start"]
    assert (3, "rollout") not in spans          # step 3 never completed: its spans are not kept
    assert recs[0]["timing/overlap"] > 0.0 and recs[1]["timing/overlap"] > 0.0
    assert recs[0]["timing/overlap"] <= recs[0]["timing/update"] + 1e-6


def test_resume_trains_every_batch_once_in_the_uninterrupted_order(run_dir, grpo_models):
    proc = train(run_dir, grpo_models, *ASYNC, "resume=auto")
    assert "resuming from" in proc.stdout and "step_2" in proc.stdout
    recs = metrics(run_dir)
    assert [r["step"] for r in recs] == [1, 2, 3]
    # batch 3 was drawn again and sampled by the resumed step-2 policy: nothing stale survives
    assert recs[2]["async/staleness_max"] == 0.0 and recs[2]["timing/overlap"] == 0.0
    cfg = load_config([f"trainer.output_dir={run_dir}"])
    loader = PromptLoader(load_prompts(cfg), cfg.data.train_batch_size, cfg.data.seed)
    expected = [[r["id"] for r in loader.next_batch()] for _ in range(3)]
    seen: dict[int, list] = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        ids = seen.setdefault(s["step"], [])
        if s["prompt_id"] not in ids:
            ids.append(s["prompt_id"])
    assert [seen[k] for k in (1, 2, 3)] == expected
    assert (run_dir / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert (run_dir / "final" / "config.json").exists()
