"""Stage spans: what the overlap metric and the timeline PNG are computed from."""
import json
import time

import pytest

from peer_rl.trainer.timeline import Timing, append_spans, covered, overlap, plot_timeline


def span(stage, start, end, step=1):
    return {"step": step, "stage": stage, "start": start, "end": end}


def test_covered_counts_overlapping_spans_once_and_clips_to_the_window():
    spans = [span("rollout", 0, 4), span("judge", 3, 6), span("redundancy", 8, 9),
             span("late", 20, 30)]
    # union inside [1, 10]: [1, 6] and [8, 9] -> 5 + 1
    assert covered(spans, 1, 10) == pytest.approx(6.0)
    assert covered(spans, 6, 8) == 0.0
    assert covered([], 0, 10) == 0.0


def test_overlap_is_the_part_of_the_next_steps_stages_inside_the_update():
    update = span("update", 10, 20)
    ahead = [span("rollout", 9, 14, 2), span("judge", 14, 16, 2), span("redundancy", 19, 23, 2)]
    assert overlap(ahead, update) == pytest.approx(4 + 2 + 1)


def test_timing_records_each_stage_span_when_its_duration_is_set(tmp_path):
    t = Timing(step=3)
    before = time.time()
    t["rollout"] = 2.5
    after = time.time()
    assert dict(t) == {"rollout": 2.5}
    (s,) = t.spans
    assert s["step"] == 3 and s["stage"] == "rollout"
    assert before <= s["end"] <= after and s["end"] - s["start"] == pytest.approx(2.5)


def test_timeline_png_shows_the_last_steps(tmp_path):
    path = tmp_path / "timeline.jsonl"
    append_spans(path, [span("rollout", 0, 2, 1), span("update", 2, 5, 1),
                        span("rollout", 2.5, 4, 2), span("update", 5, 8, 2)])
    assert len(path.read_text().splitlines()) == 4
    assert json.loads(path.read_text().splitlines()[2])["step"] == 2
    png = plot_timeline(path, tmp_path / "t.png", last_steps=2)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_timeline(tmp_path / "missing.jsonl", tmp_path / "u.png") is None


def test_a_torn_last_span_does_not_fail_the_figure_after_a_finished_run(tmp_path):
    """A crash mid-append left half a line; the resumed run appended after it. The figure is
    drawn from the whole lines (the sink repairs the file on resume: tests/tracking/test_metrics.py)."""
    path = tmp_path / "timeline.jsonl"
    append_spans(path, [span("rollout", 0, 2, 1), span("update", 2, 5, 1)])
    with open(path, "a") as fh:
        fh.write('{"step": 2, "stage": "roll')
    png = plot_timeline(path, tmp_path / "t.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
