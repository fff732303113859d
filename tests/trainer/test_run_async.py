"""`peer-rl train` with trainer.async_training.staleness=1 and dynamic sampling, in a fresh
process: the next step's rollout, judging, redundancy and refills run inside this step's update,
every trained sample is one update old (checked by the policy against the engines' stamps).
SIGTERM during step 2 (checkpoints only at the end) stops the run after step 2 with that step
checkpointed (exit 143); `resume=auto` then trains step 3. Dynamic sampling filters on the
judge's reward, which for the tiny random policy is mostly 0, so whole groups often tie; at most
2 draws a step. Which groups come out of each draw is up to the models: every step is checked
against a replay of the data order (its prompts come from the batches it drew, in order, right
after the previous step's), every kept group's reward varies, and a short step is one that hit
the draw limit (on_limit=train_short: trained short rather than stopped). The policy trains LoRA
adapters (model.lora.rank=8), which none of this depends on: the run is tests/trainer/conftest.py's
async_lora_run, which tests/trainer/test_lora_run.py reads too (one run for both)."""
import json

import pytest
from train_util import metrics

from peer_rl.config.schema import load_config
from peer_rl.data.prompt_loader import PromptLoader
from peer_rl.trainer.run import load_prompts

pytestmark = pytest.mark.e2e


@pytest.fixture
def runs(async_lora_run) -> dict:
    """Both runs, and what the first left behind before the second touched it."""
    return async_lora_run


def test_sigterm_finishes_the_step_checkpoints_it_and_exits_143(runs):
    first, out = runs["first"], runs["out"]
    assert first["code"] == 143, first["stderr"][-4000:]
    assert "[peer-rl] SIGTERM: finishing the current step" in first["stderr"]
    assert (f"stopped by SIGTERM after step 2 of 3; checkpoint {out / 'checkpoints' / 'step_2'}"
            "; rerun with resume=auto") in first["stderr"], first["stderr"][-3000:]
    assert "Traceback" not in first["stderr"]
    assert [r["step"] for r in first["recs"]] == [1, 2]
    assert first["checkpoints"] == ["step_2"] and not first["final"]


def test_samples_are_one_update_old_and_were_drawn_during_the_previous_update(runs):
    recs, spans = runs["first"]["recs"], runs["first"]["spans"]
    # step 1 was sampled by the initial policy; step 2 during the update before, by the same
    # weights
    assert recs[0]["async/staleness_max"] == 0.0
    for r in recs[1:]:
        assert r["async/staleness_max"] == r["async/staleness_mean"] == 1.0
        assert 0.0 < r["async/behavior_weight_mean"] <= 2.0
    # step 2's rollout (its first draw) began inside update 1, ended before update 1's sync
    update, ahead = spans[(1, "update")], spans[(2, "rollout")]
    assert update["start"] <= ahead["start"] < update["end"]
    assert ahead["end"] <= spans[(1, "sync")]["start"]
    assert (3, "rollout") not in spans         # step 3 never completed: its spans are not kept
    assert recs[0]["timing_s/overlap"] > 0.0 and recs[1]["timing_s/overlap"] > 0.0
    assert recs[0]["timing_s/overlap"] <= recs[0]["timing_s/update"] + 1e-6


def test_resume_trains_each_step_once_in_the_uninterrupted_data_order(runs):
    out, proc = runs["out"], runs["resumed"]
    assert "resuming from" in proc.stdout and "step_2" in proc.stdout
    recs = metrics(out)
    assert [r["step"] for r in recs] == [1, 2, 3]
    # step 3 was drawn again and sampled by the resumed step-2 policy: nothing stale survives
    assert recs[2]["async/staleness_max"] == 0.0 and recs[2]["timing_s/overlap"] == 0.0
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "final" / "config.json").exists()
    cfg = load_config([f"trainer.output_dir={out}"])
    B = cfg.data.train_batch_size
    replay = PromptLoader(load_prompts(cfg), B, cfg.data.seed)
    kept = _kept(out)
    max_draws = runs["max_draws"]
    for rec in recs:
        step, draws, n_kept = rec["step"], rec["filter/gen_batches"], rec["filter/kept_groups"]
        assert 1 <= draws <= max_draws and 0 <= n_kept <= B
        batches = [[r["id"] for r in replay.next_batch()] for _ in range(draws)]
        drawn = [i for b in batches for i in b]
        ids = [pid for pid, _ in kept[step]]
        share = rec["filter/zero_variance_share"]       # groups tied on the filter's metric
        assert rec["groups/zero_variance_share/reward"] == pytest.approx(share)
        # the reweighted share over all drawn groups, which samples.jsonl (the trained groups) does
        # not hold: its arithmetic is tests/trainer/test_dynamic_sampling.py's; here, a group
        # whose reweighted value ties had tied rewards (RUR splits a tie of nonzero rewards)
        assert 0.0 <= rec["groups/zero_variance_share/reweighted"] <= share + 1e-9
        if n_kept == 0:       # nothing had a signal: the first batch, trained as it is
            assert ids == batches[0] and draws == max_draws and share == 1.0
            continue
        assert len(ids) == n_kept
        it = iter(drawn)      # a subsequence of what was drawn, in draw order
        assert all(any(pid == d for d in it) for pid in ids), (step, ids, drawn)
        for pid, rewards in kept[step]:
            assert len(rewards) == cfg.rollout.n and max(rewards) > min(rewards), (step, pid)
        if n_kept < B:        # short only at the limit: every group with signal was kept
            assert draws == max_draws and rec["filter/short"] == 1.0
            assert share == pytest.approx((draws * B - n_kept) / (draws * B))
        else:                 # full: the last draw was needed
            assert rec["filter/short"] == 0.0
            assert share <= (draws * B - B) / (draws * B) + 1e-9
            if draws > 1:
                assert ids[-1] in drawn[-B:]
    print(f"\ndraws per step { {r['step']: r['filter/gen_batches'] for r in recs} }, kept "
          f"{ {r['step']: r['filter/kept_groups'] for r in recs} }")


def _kept(out) -> dict[int, list]:
    """Per step: [(prompt id, [rewards of its G samples])] in the order the step trained them."""
    steps: dict[int, dict] = {}
    for line in (out / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        steps.setdefault(s["step"], {}).setdefault(s["uid"], (s["prompt_id"], []))[1].append(
            s["reward"])
    return {k: [v[u] for u in sorted(v)] for k, v in steps.items()}
