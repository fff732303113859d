"""The supervised launcher's progress bar, read off the metrics rank 0 writes (no Ray)."""
import io
import json

from peer_rl.trainer.supervised_run import StepBar


def test_the_bar_follows_the_newest_complete_record_and_ends_on_the_last(tmp_path, monkeypatch):
    metrics = tmp_path / "metrics.jsonl"
    bar = StepBar(metrics, total=150, name="sft", poll_s=60)    # polled here by hand
    assert bar.latest() is None                                 # nothing written yet
    metrics.write_text(json.dumps({"step": 25, "loss": 4.5}) + "\n")
    assert bar.latest() == {"step": 25, "loss": 4.5}
    # a record being written when the driver reads is skipped, the one before it shown
    metrics.write_text(json.dumps({"step": 25, "loss": 4.5}) + "\n" + '{"step": 50, "lo')
    assert bar.latest() == {"step": 25, "loss": 4.5}
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with bar:
        metrics.write_text("\n".join(json.dumps({"step": s, "loss": 1.0 / s})
                                     for s in (25, 50, 150)) + "\n")
    assert bar.bar.n == 150
    last = err.getvalue().split("\r")[-1]
    assert last.startswith("sft: 100%") and "150/150" in last and "loss=0.0067" in last

