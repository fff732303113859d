"""`peer-rl bench memory`: the baseline run's footprint carried to another run, worked out by
hand from memory.json files written here (the model parts cancel: both runs are the tiny
recipe, so each ratio is the baseline's peak over the other run's)."""
import json

from peer_rl.cli import main
from peer_rl.config.schema import load_config, save_config


def _run(path, peaks: dict, *overrides):
    path.mkdir()
    save_config(load_config([f"trainer.output_dir={path}", *overrides]), path / "config.yaml")
    (path / "memory.json").write_text(json.dumps({"peak_rss_gib": peaks, "unanswered": []}))
    return path


def test_the_baseline_footprint_is_carried_and_each_ratio_printed(tmp_path, capsys):
    base = _run(tmp_path / "base", {"rollout": [1.2, 1.1], "reward_model": [1.3],
                                    "actor": [1.25], "redundancy": [0.7]},
                "actor.malloc_mmap_threshold_mib=0")
    other = _run(tmp_path / "other", {"rollout": [1.5], "reward_model": [1.3],
                                      "actor": [2.5], "redundancy": [0.7]},
                 "actor.malloc_mmap_threshold_mib=4")
    assert main(["bench", "memory", str(other), "--baseline", str(base)]) == 0
    out = capsys.readouterr().out
    rows = {tuple(ln.split()[:2]): ln.split() for ln in out.splitlines()
            if ln.startswith(("base ", "other "))}
    # columns: run pool model-parts estimate measured ratio; a pool's peak is its largest worker
    for pool, peak in (("rollout", 1.2), ("reward_model", 1.3), ("actor", 1.25)):
        assert float(rows[("base", pool)][4]) == peak and rows[("base", pool)][5] == "1.00"
        assert float(rows[("other", pool)][3]) == peak       # same model: the same estimate
    assert rows[("other", "rollout")][5] == f"{1.2 / 1.5:.2f}"      # 0.80
    assert rows[("other", "actor")][5] == f"{1.25 / 2.5:.2f}"       # 0.50
    assert rows[("other", "reward_model")][5] == "1.00"
    assert "largest |estimate / measured - 1| outside the baseline run: 50%" in out
    # what the ranks allocated with, which the measured peak depends on
    assert out.count("(glibc's own mmap threshold)") == 1 and "(glibc mmap threshold 4 MiB)" in out


def test_a_directory_that_is_not_a_finished_run_is_named(tmp_path, capsys):
    base = _run(tmp_path / "base", {"actor": [1.0]})
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.yaml").write_text("{}")
    assert main(["bench", "memory", str(tmp_path / "half"), "--baseline", str(base)]) == 2
    assert f"{tmp_path / 'half'}: not a finished `peer-rl train` output directory (no " \
           "memory.json)" in capsys.readouterr().err


def test_a_run_saved_before_the_threshold_setting_is_named_as_glibcs_own(tmp_path, capsys):
    """Runs older than actor.malloc_mmap_threshold_mib ran with glibc's own threshold, though
    the schema's default (what loading their config fills in) is now 4 MiB."""
    import yaml

    base = _run(tmp_path / "base", {"actor": [1.25]}, "actor.malloc_mmap_threshold_mib=4")
    old = _run(tmp_path / "old", {"actor": [1.25]})
    saved = yaml.safe_load((old / "config.yaml").read_text())
    del saved["actor"]["malloc_mmap_threshold_mib"]
    (old / "config.yaml").write_text(yaml.safe_dump(saved))
    assert main(["bench", "memory", str(old), "--baseline", str(base)]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines()
            if ln.startswith(("base ", "old ")) and ln.split()[1] == "actor"]
    assert [r.endswith("(glibc mmap threshold 4 MiB)") for r in rows] == [True, False]
    assert rows[1].endswith("(glibc's own mmap threshold)")
