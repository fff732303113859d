"""`peer-rl plot`: a run's figures drawn again from its files into another directory."""
import json

import pytest

from peer_rl.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


def _run(tmp_path, steps=3):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward/mean": 1.0 + s / 4, "reward/format_rate": 0.5})
        + "\n" for s in range(1, steps + 1)))
    (run / "timeline.jsonl").write_text("".join(
        json.dumps({"step": s, "stage": stage, "start": 10.0 * s + i, "end": 10.0 * s + i + 1})
        + "\n" for s in range(1, steps + 1) for i, stage in enumerate(("rollout", "update"))))
    (run / "config.yaml").write_text("experiment_name: tiny_x\ntrainer:\n  async_training:\n"
                                     "    staleness: 1\n")
    return run


def test_both_figures_go_to_out_and_the_run_is_left_as_it_was(tmp_path, capsys):
    run = _run(tmp_path)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert main(["plot", str(run), "--out", str(tmp_path / "figs")]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "figs" / "curves.png"),
                       str(tmp_path / "figs" / "timeline.png")]
    for p in printed:
        with open(p, "rb") as fh:
            assert fh.read(8) == PNG
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_a_directory_without_metrics_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["plot", str(tmp_path / "empty"), "--out", str(tmp_path / "figs")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {tmp_path / 'empty'}: holds no metrics.jsonl; expected the output "
                   "directory of a `peer-rl train` run (trainer.output_dir) with a step logged\n")
    assert not (tmp_path / "figs").exists()


def test_the_title_comes_from_the_runs_config(tmp_path, monkeypatch):
    seen = {}
    from peer_rl.trainer import figures

    monkeypatch.setattr(figures, "draw_figures",
                        lambda run, out, name, staleness: seen.update(n=name, s=staleness) or
                        [out / "curves.png"])
    assert main(["plot", str(_run(tmp_path)), "--out", str(tmp_path / "figs")]) == 0
    assert seen == {"n": "tiny_x", "s": 1}


@pytest.mark.parametrize("text", ["", '{"step": 1}\n'])
def test_nothing_to_draw_is_said(tmp_path, capsys, text):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(text)
    assert main(["plot", str(run), "--out", str(tmp_path / "figs")]) == 2
    assert capsys.readouterr().err == f"error: {run / 'metrics.jsonl'}: no step to draw yet\n"
