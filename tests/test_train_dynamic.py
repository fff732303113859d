"""`peer-rl train` with dynamic sampling (algorithm.filter_groups on the judge's reward, which
for the tiny random policy is mostly 0, so whole groups often tie; at most 2 draws a step) and the staleness-1 look-ahead, stopped by SIGTERM during step 2 (it finishes
step 2, checkpoints it and exits 143), then `resume=auto` to step 3. Which
groups come out of each draw is up to the models; every step is checked against a replay of
the data order: its prompts come from the batches it drew, in order, right after the previous
step's, every kept group has a reward that varies, and a short step is one that hit the limit."""
import json

import pytest
from train_util import metrics, train, train_and_signal_after

from peer_rl.config import load_config
from peer_rl.dataloader import PromptLoader
from peer_rl.train import load_prompts

pytestmark = pytest.mark.e2e

MAX_DRAWS = 2
DYNAMIC = ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=reward",
           f"algorithm.filter_groups.max_num_gen_batches={MAX_DRAWS}",
           "trainer.async_training.staleness=1"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, grpo_models):
    out = tmp_path_factory.mktemp("train_dynamic")
    # checkpoints only at the end (save_freq=0): step_2 exists only if the signal wrote it
    code, stdout, stderr = train_and_signal_after(out, grpo_models, 1, "trainer.total_steps=3",
                                                  "trainer.save_freq=0", *DYNAMIC)
    assert code == 143, stdout[-2000:] + stderr[-4000:]
    assert "[peer-rl] SIGTERM: finishing the current step" in stderr
    assert (f"stopped by SIGTERM after step 2 of 3; checkpoint {out / 'checkpoints' / 'step_2'}"
            "; rerun with resume=auto") in stderr, stderr[-3000:]
    assert "Traceback" not in stderr
    assert [r["step"] for r in metrics(out)] == [1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2"]
    assert not (out / "final").exists()
    resumed = train(out, grpo_models, "trainer.total_steps=3", "resume=auto", *DYNAMIC)
    assert "resuming from" in resumed.stdout and "step_2" in resumed.stdout
    return out


def _kept(out) -> dict[int, list]:
    """Per step: [(prompt id, [rewards of its G samples])] in the order the step trained them."""
    steps: dict[int, dict] = {}
    for line in (out / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        steps.setdefault(s["step"], {}).setdefault(s["uid"], (s["prompt_id"], []))[1].append(
            s["reward"])
    return {k: [v[u] for u in sorted(v)] for k, v in steps.items()}


def test_each_step_trains_groups_with_signal_drawn_in_the_uninterrupted_order(run_dir):
    recs = metrics(run_dir)
    assert [r["step"] for r in recs] == [1, 2, 3]           # none duplicated by the resume
    cfg = load_config([f"trainer.output_dir={run_dir}"])
    B = cfg.data.train_batch_size
    replay = PromptLoader(load_prompts(cfg), B, cfg.data.seed)
    kept = _kept(run_dir)
    for rec in recs:
        step, draws, n_kept = rec["step"], rec["filter/gen_batches"], rec["filter/kept_groups"]
        assert 1 <= draws <= MAX_DRAWS and 0 <= n_kept <= B
        batches = [[r["id"] for r in replay.next_batch()] for _ in range(draws)]
        drawn = [i for b in batches for i in b]
        ids = [pid for pid, _ in kept[step]]
        share = rec["filter/zero_variance_share"]    # groups tied on the filter's metric
        if n_kept == 0:       # nothing had a signal: the first batch, trained as it is
            assert ids == batches[0] and draws == MAX_DRAWS and share == 1.0
            continue
        assert len(ids) == n_kept
        it = iter(drawn)      # a subsequence of what was drawn, in draw order
        assert all(any(pid == d for d in it) for pid in ids), (step, ids, drawn)
        for pid, rewards in kept[step]:
            assert len(rewards) == cfg.rollout.n and max(rewards) > min(rewards), (step, pid)
        if n_kept < B:        # short only at the limit: every group with signal was kept
            assert draws == MAX_DRAWS and rec["filter/short"] == 1.0
            assert share == pytest.approx((draws * B - n_kept) / (draws * B))
        else:                 # full: the last draw was needed
            assert rec["filter/short"] == 0.0
            assert share <= (draws * B - B) / (draws * B) + 1e-9
            if draws > 1:
                assert ids[-1] in drawn[-B:]
        assert rec["groups/zero_variance_share/reward"] == pytest.approx(share)  # same metric
        assert 0.0 <= rec["groups/zero_variance_share/final"] <= 1.0
    steps_drawn = {r["step"]: r["filter/gen_batches"] for r in recs}
    print(f"\ndraws per step {steps_drawn}, kept "
          f"{ {r['step']: r['filter/kept_groups'] for r in recs} }")
    # step 2 was scored during update 1 (the look-ahead), its refills included
    assert recs[1]["async/staleness_max"] == 1.0
