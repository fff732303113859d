"""Checkpoint retention (trainer.max_actor_ckpt_to_keep)."""
from peer_rl.checkpoints import STATE_FILE, latest_checkpoint, prune_checkpoints


def _ckpt(root, name, complete=True):
    d = root / "checkpoints" / name
    d.mkdir(parents=True)
    if complete:
        (d / STATE_FILE).write_text("{}")
    return d


def test_only_the_newest_complete_checkpoints_are_kept(tmp_path):
    for step in (5, 10, 15, 20):        # numeric order, not name order: step_5 < step_10
        _ckpt(tmp_path, f"step_{step}")
    _ckpt(tmp_path, "step_25.tmp", complete=False)
    _ckpt(tmp_path, "step_30", complete=False)
    gone = prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in gone) == ["step_10", "step_5"]
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == ["step_15", "step_20", "step_25.tmp", "step_30"]
    assert latest_checkpoint(tmp_path).name == "step_20"


def test_keep_zero_deletes_nothing(tmp_path):
    for step in (1, 2, 3):
        _ckpt(tmp_path, f"step_{step}")
    assert prune_checkpoints(tmp_path, keep=0) == []
    assert len(list((tmp_path / "checkpoints").iterdir())) == 3
