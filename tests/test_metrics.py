"""Issue 24.5: a metrics.jsonl torn by a crash mid-write does not stop resume=auto."""
import json

import pytest

from peer_rl.config import ConfigError
from peer_rl.metrics import MetricsSink, truncate_jsonl


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
