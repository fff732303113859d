"""`peer-rl bench trl`'s table: medians after the warm-up step, update shares and the ratios
against TRL's equal-work row, worked out by hand."""
import sys

import pytest

from peer_rl.bench.trl import _run_tree, spread, table

MB = 2**20


def test_the_table_takes_medians_after_the_first_step_and_ratios_against_equal_work():
    ours = {"steps": [300.0, 90.0, 110.0, 100.0], "update": [200.0, 40.0, 60.0, 50.0],
            "peak": 9e9, "peak_rss": 11e9, "sync": [9.0, 0.5, 0.25, 0.75],
            "sync_bytes": 3 * MB}
    equal = {"steps": [250.0, 200.0, 180.0, 220.0], "update": [150.0, 120.0, 100.0, 140.0],
             "peak": 6e9, "peak_rss": 6.2e9}
    defaults = {"steps": [100.0, 150.0, 150.0], "update": [50.0, 60.0, 80.0], "peak": 3e9,
                "peak_rss": 3.1e9}
    lines = table([("ours", ours), ("trl equal", equal), ("trl defaults", defaults)]).splitlines()
    # medians of steps 2..: ours 100 (update 50, sync 0.5), equal 200 (update 120), defaults
    # 150 (70); TRL syncs no engine
    assert lines[1].split() == ["ours", "100.0", "300.0", "50.0", "50%", "0.50", "3.0", "9.0",
                                "11.0"]
    assert lines[2].split() == ["trl", "equal", "200.0", "250.0", "120.0", "60%", "-", "-", "6.0",
                                "6.2"]
    assert lines[3].split() == ["trl", "defaults", "150.0", "100.0", "70.0", "47%", "-", "-",
                                "3.0", "3.1"]
    assert lines[4] == ("step-time ratio peer-rl / TRL at equal work: 0.50 (goal <= 0.35); "
                        "peer-rl's update share 50% (goal <= 50%); peak memory ratio 1.5x "
                        "(goal <= 2x)")


def test_peer_rls_side_alone_is_its_row_without_ratios():
    ours = {"steps": [300.0, 90.0, 110.0], "update": [200.0, 40.0, 60.0], "peak": 9e9,
            "peak_rss": 11e9, "sync": [1.0, 0.2, 0.4], "sync_bytes": MB // 2}
    lines = table([("ours", ours)]).splitlines()
    assert len(lines) == 2
    assert lines[1].split() == ["ours", "100.0", "300.0", "50.0", "50%", "0.30", "0.5", "9.0",
                                "11.0"]


def test_without_trl_the_bench_stops_before_peer_rls_side_naming_the_install(monkeypatch, capsys):
    """TRL is an optional extra: its absence is said at once (exit 2), not after peer-rl's side
    has run for minutes."""
    import importlib.util

    import peer_rl.bench.models as models
    from peer_rl.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "trl" else real(name, *a))
    monkeypatch.setattr(models, "random_policy", lambda *a: (_ for _ in ()).throw(
        AssertionError("peer-rl's side started")))
    assert main(["bench", "trl", "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "needs TRL" in err and 'pip install --no-deps "trl==' in err and "--peer-only" in err


def test_each_bench_answers_help_with_its_usage(capsys):
    from peer_rl.cli import main

    for name, usage in (("step", "peer-rl bench step [KEY=VALUE ...]"),
                        ("rewards", "peer-rl bench rewards [N_GROUPS]"),
                        ("model", "peer-rl bench model [NAME ...]")):
        assert main(["bench", name, "--help"]) == 0
        assert usage in capsys.readouterr().out


def test_an_unknown_model_is_refused_naming_the_choices(capsys):
    from peer_rl.cli import main

    assert main(["bench", "trl", "--peer-only", "--model", "1B"]) == 2
    err = capsys.readouterr().err
    assert "--model '1B': expected one of tiny, 10M, 100M, 500M, 135M, smollm2" in err


def test_smollm2_takes_the_english_prompts_on_both_sides():
    """The real SmolLM2 reads English only: both sides are given data.languages=[english], and
    the prompts TRL's side takes are then English rows of the sample."""
    from peer_rl.bench.rollout import _prompts
    from peer_rl.bench.models import REAL_MODELS
    from peer_rl.config.schema import load_config
    from peer_rl.trainer.run import load_prompts

    data = REAL_MODELS["smollm2"][1]
    assert data == ["data.languages=[english]"]
    english = [r["messages"] for r in load_prompts(load_config(
        ["data.train_files=[grpo/textual.jsonl]", *data])) if not r.get("images")]
    every = [r for r in load_prompts(load_config(["data.train_files=[grpo/textual.jsonl]"]))]
    assert len(english) < len(every)              # the sample has rows in other languages
    prompts = _prompts(8, data)
    assert len(prompts) == 8
    assert all(p[-1]["content"] in {m[-1]["content"] for m in english} for p in prompts)


@pytest.mark.e2e   # a child process tree
def test_a_tree_sharing_its_pages_is_counted_once_by_pss_and_thrice_by_rss():
    """A process touches 300 MB, then forks two children that keep the pages (copy-on-write,
    never written): the machine holds ~300 MB, each of the three processes has them resident."""
    child = ("import os, time\n"
             "data = b'x' * (300 << 20)\n"
             "for _ in range(2):\n"
             "    if os.fork() == 0:\n"
             "        time.sleep(4)\n"
             "        os._exit(0)\n"
             "for _ in range(2):\n"
             "    os.wait()\n")
    _, (pss, rss), _ = _run_tree([sys.executable, "-c", child])
    assert rss > 3 * 300 * MB, rss / MB
    assert 300 * MB < pss < 1.5 * 300 * MB + 3 * 40 * MB, pss / MB  # + three interpreters


def test_repeated_runs_report_each_figures_median_and_every_run():
    def side(step, update, peak):   # warm-up step first, then steps whose median is `step`
        return {"steps": [999.0, step - 1, step + 1], "update": [999.0, update, update],
                "peak": peak, "peak_rss": peak}
    runs = [(side(100.0, 80.0, 8e9), side(200.0, 150.0, 4e9)),     # 0.50, 80%, 2.0x
            (side(120.0, 90.0, 9e9), side(200.0, 150.0, 5e9)),     # 0.60, 75%, 1.8x
            (side(90.0, 63.0, 7e9), side(200.0, 150.0, 5e9))]      # 0.45, 70%, 1.4x
    assert spread(runs) == (
        "over 3 runs, each side alternating: step-time ratio median 0.50 (runs: 0.50, 0.60, "
        "0.45); update share median 75% (runs: 80%, 75%, 70%); peak memory ratio median 1.8x "
        "(runs: 2.0x, 1.8x, 1.4x)")


def test_repeats_below_one_are_refused_naming_the_flag():
    from peer_rl.bench.trl import main
    from peer_rl.errors import ConfigError

    with pytest.raises(ConfigError, match="--repeats 0: expected at least 1"):
        main(["--repeats", "0", "--peer-only"])


@pytest.mark.e2e   # a child process tree
def test_the_peak_over_the_steps_leaves_out_what_comes_after_them(tmp_path):
    """peer-rl's last metrics line precedes its final checkpoint, which TRL's side does not
    write: a child holds 50 MB, marks its steps done, then touches 400 MB more."""
    marker = tmp_path / "done"
    child = ("import time, pathlib\n"
             "a = b'x' * (50 << 20)\n"
             "time.sleep(1.5)\n"
             f"pathlib.Path({str(marker)!r}).write_text('1')\n"
             "time.sleep(1.5)\n"
             "b = b'y' * (400 << 20)\n"
             "time.sleep(1.5)\n")
    _, (whole, _), (steps, steps_rss) = _run_tree([sys.executable, "-c", child], marker.exists)
    assert whole > 450 * MB, whole / MB
    assert 50 * MB < steps < 50 * MB + 100 * MB, steps / MB      # + the interpreter
    assert steps_rss < 50 * MB + 100 * MB, steps_rss / MB


def test_the_table_names_peer_rls_peak_with_its_final_checkpoint_when_measured():
    ours = {"steps": [300.0, 100.0], "update": [200.0, 50.0], "peak": 9e9, "peak_rss": 11e9,
            "peak_with_save": 12.5e9}
    equal = {"steps": [250.0, 200.0], "update": [150.0, 120.0], "peak": 6e9, "peak_rss": 6.2e9}
    lines = table([("ours", ours), ("trl equal", equal)]).splitlines()
    assert lines[-1] == ("peak memory is over the steps; peer-rl's whole run, its final "
                         "checkpoint included (TRL's side writes none): 12.5 GB")
    assert "peak memory ratio 1.5x" in lines[-2]
