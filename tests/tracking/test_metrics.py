"""A run's append-only logs (metrics.jsonl, samples.jsonl, timeline.jsonl) torn by a crash
mid-write do not stop resume=auto, and are cut back to the checkpoint's step."""
import json

import pytest

from peer_rl.config.schema import ConfigError
from peer_rl.tracking.metrics import MetricsSink, current_name, read_metrics, truncate_jsonl


def _write(path, steps, tail=""):
    path.write_text("".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n"
                            for s in steps) + tail)


def test_a_torn_last_line_is_dropped_with_a_warning(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    _write(path, [1, 2, 3], tail='{"step": 4, "rew')
    sink = MetricsSink(tmp_path, ["jsonl"], resume_step=2)
    assert "metrics.jsonl:4: dropped a torn last line" in capsys.readouterr().err
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]
    sink.log(3, {"reward/mean": 0.5})
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3]
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_a_damaged_line_before_the_end_stops_the_resume_naming_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl:2: not a JSON record"):
        truncate_jsonl(path, 5)
    assert path.read_text() == '{"step": 1}\nnot json\n{"step": 2}\n'


def test_a_resume_cuts_every_log_back_to_the_checkpoint_and_repairs_its_tail(tmp_path):
    """Steps 3 and 4 are redone after a resume from step 2: each appears once afterwards in
    metrics, samples and the timeline; the timeline's torn tail is gone before the next
    append; a fresh run's leftovers are not appended to."""
    for name in ("metrics.jsonl", "samples.jsonl", "timeline.jsonl"):
        _write(tmp_path / name, [1, 2, 3], tail='{"step": 4, "sta')
    sink = MetricsSink(tmp_path, ["jsonl"], resume_step=2)
    for name in ("metrics.jsonl", "samples.jsonl", "timeline.jsonl"):
        text = (tmp_path / name).read_text()
        assert [json.loads(x)["step"] for x in text.splitlines()] == [1, 2], name
        assert text.endswith("\n")
    from peer_rl.trainer.timeline import append_spans

    append_spans(tmp_path / "timeline.jsonl", [{"step": 3, "stage": "rollout", "start": 0,
                                                "end": 1}])
    assert [json.loads(x)["step"] for x in
            (tmp_path / "timeline.jsonl").read_text().splitlines()] == [1, 2, 3]
    sink.close()


# a step as metrics.jsonl held it before the keys took verl's names
OLD_STEP = {"reward/mean": 0.5, "actor/clip_frac": 0.25, "actor/approx_kl": 0.01,
            "actor/pg_clipfrac_lower": 0.0, "timing/step": 6.0, "timing/update": 4.0,
            "timing_s/update_actor": 3.0}


def test_old_metric_names_are_read_back_under_verls():
    assert current_name("actor/clip_frac") == "actor/pg_clipfrac"
    assert current_name("actor/approx_kl") == "actor/ppo_kl"
    assert current_name("timing/update") == "timing_s/update"
    # renamed twice (timing_s/, then ESCRAG-R1's pass 2 became `refined`): the newest name
    assert current_name("timing/rollout_final") == "timing_s/rollout_refined"
    assert current_name("timing_s/rollout_final") == "timing_s/rollout_refined"
    for key in ("timing_s/update_actor", "actor/pg_clipfrac_lower", "reward/mean",
                "actor/clip_frac_x"):
        assert current_name(key) == key


def test_a_resumed_run_written_under_the_old_names_reads_back_under_one_set(tmp_path):
    """Steps 1-2 written before the rename, step 3 by today's sink after a resume: read back,
    every step has the same keys, with the values written."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, **OLD_STEP}) + "\n" for s in (1, 2)))
    sink = MetricsSink(tmp_path, ["jsonl"], resume_step=2)
    sink.log(3, {"reward/mean": 0.5, "actor/pg_clipfrac": 0.75, "actor/ppo_kl": 0.02,
                 "actor/pg_clipfrac_lower": 0.0, "timing_s/step": 5.0, "timing_s/update": 3.5,
                 "timing_s/update_actor": 2.0})
    sink.close()
    recs = read_metrics(path)
    assert [r["actor/pg_clipfrac"] for r in recs] == [0.25, 0.25, 0.75]
    assert [r["timing_s/step"] for r in recs] == [6.0, 6.0, 5.0]
    assert [r["actor/ppo_kl"] for r in recs] == [0.01, 0.01, 0.02]
    assert all(r.keys() == recs[2].keys() for r in recs)


def test_a_run_written_under_the_old_names_still_plots(tmp_path):
    from peer_rl.tracking.plot import plot_curves

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, **OLD_STEP}) + "\n" for s in (1, 2, 3)))
    png = plot_curves(path, {"rate": ["actor/pg_clipfrac"], "seconds": ["timing_s/update"]},
                      tmp_path / "curves.png")
    assert png == tmp_path / "curves.png" and png.stat().st_size > 0
