"""A run directory written before issue 59's renames (`reward/final_mean`,
`groups/zero_variance_share/final`, `timing_s/rollout_final`, ...) reads under today's names
wherever peer-rl reads metrics.jsonl back: the curves figure, the chain report's training table
and curves."""
import json

from peer_rl.chain.report import read_curves
from peer_rl.tracking.metrics import current_name, read_metrics
from peer_rl.tracking.plot import plot_curves

OLD_STEPS = [   # as an ESCRAG-R1 run with dynamic sampling wrote them before the renames
    {"step": 1, "reward/mean": 0.5, "reward/final_mean": 0.5, "reward/initial_mean": 0.25,
     "reward/final_minus_initial": 0.25, "groups/zero_variance_share/final": 0.75},
    {"step": 2, "reward/mean": 0.75, "reward/final_mean": 0.75, "reward/initial_mean": 0.5,
     "reward/final_minus_initial": 0.25, "groups/zero_variance_share/final": 0.5},
]


def _write(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_old_names_of_the_reweighted_and_refined_figures_map_to_todays():
    assert current_name("reward/final_mean") == "reward/refined_mean"
    assert current_name("reward/final_minus_initial") == "reward/refined_minus_initial"
    assert current_name("groups/zero_variance_share/final") == \
        "groups/zero_variance_share/reweighted"
    for key in ("reward/mean", "reward/initial_mean", "groups/zero_variance_share/reward",
                "reward/refined_mean"):
        assert current_name(key) == key


def test_an_old_run_reads_back_under_todays_names_with_its_values(tmp_path):
    _write(tmp_path / "metrics.jsonl", OLD_STEPS)
    first, second = read_metrics(tmp_path / "metrics.jsonl")
    assert first == {"step": 1, "reward/mean": 0.5, "reward/refined_mean": 0.5,
                     "reward/initial_mean": 0.25, "reward/refined_minus_initial": 0.25,
                     "groups/zero_variance_share/reweighted": 0.75}
    assert second["groups/zero_variance_share/reweighted"] == 0.5


def test_the_curves_figure_plots_an_old_run_under_the_new_key(tmp_path):
    _write(tmp_path / "metrics.jsonl", OLD_STEPS)
    out = plot_curves(tmp_path / "metrics.jsonl", {"reward": ["reward/refined_mean"]},
                      tmp_path / "c.png")
    assert out == tmp_path / "c.png" and out.stat().st_size > 0
    # a key no record holds under either name draws nothing
    assert plot_curves(tmp_path / "metrics.jsonl", {"reward": ["reward/nothing"]},
                       tmp_path / "d.png") is None


def test_the_chain_report_reads_an_old_grpo_run_under_the_new_names(tmp_path):
    _write(tmp_path / "grpo" / "escrag_r1_s1" / "metrics.jsonl", OLD_STEPS)
    runs = read_curves(tmp_path)
    assert [r["reward/refined_mean"] for r in runs["escrag_r1_s1"]] == [0.5, 0.75]
    assert not any("reward/final_mean" in r for r in runs["escrag_r1_s1"])


def test_an_old_runs_pass_2_timing_reads_back_as_rollout_refined(tmp_path):
    """ESCRAG-R1's pass-2 stage was `rollout_final` (under timing/, then timing_s/): both old
    spellings read back as timing_s/rollout_refined, beside a step written today."""
    _write(tmp_path / "metrics.jsonl", [
        {"step": 1, "timing/rollout": 1.0, "timing/rollout_final": 2.0},
        {"step": 2, "timing_s/rollout": 1.5, "timing_s/rollout_final": 2.5},
        {"step": 3, "timing_s/rollout": 0.5, "timing_s/rollout_refined": 3.0}])
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["timing_s/rollout_refined"] for r in recs] == [2.0, 2.5, 3.0]
    assert all(r.keys() == {"step", "timing_s/rollout", "timing_s/rollout_refined"} for r in recs)
