"""Checkpoint retention (trainer.max_actor_ckpt_to_keep)."""
from peer_rl.trainer.checkpoints import STATE_FILE, latest_checkpoint, prune_checkpoints


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


def test_pruning_never_deletes_a_checkpoint_later_than_the_one_just_saved(tmp_path):
    """Issue 58.7: pruning after saving step 4 must not count a later step_6 / step_8 (another
    timeline's, had one been left there) as newer than step 4 and delete step 4 itself."""
    for step in (2, 4, 6, 8):
        _ckpt(tmp_path, f"step_{step}")
    gone = prune_checkpoints(tmp_path, keep=1, upto=4)
    assert [p.name for p in gone] == ["step_2"]
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == ["step_4", "step_6", "step_8"]


def test_shards_the_controller_cannot_see_are_named(tmp_path):
    """Issue 24.4: a rank's shards on another node's disk (or cut short) must stop the
    checkpoint before its state file marks it complete."""
    from peer_rl.trainer.checkpoints import not_shared_error, unseen_files
    from peer_rl.files.durable import fsync_tree

    (tmp_path / "dcp").mkdir()
    (tmp_path / "dcp" / "shard-0.safetensors").write_bytes(b"x" * 10)
    seen_here = fsync_tree(tmp_path)
    assert seen_here == {"dcp/shard-0.safetensors": 10}
    reports = [{"rank": 0, "host": "head", "files": seen_here},
               {"rank": 1, "host": "gpu-7", "files": {"dcp/shard-1.safetensors": 10,
                                                        "dcp/shard-0.safetensors": 10}},
               {"rank": 2, "host": "gpu-8", "files": {"dcp/shard-0.safetensors": 9}}]
    assert unseen_files(tmp_path, reports) == ["rank 1 on gpu-7: dcp/shard-1.safetensors",
                                               "rank 2 on gpu-8: dcp/shard-0.safetensors"]
    assert unseen_files(tmp_path, reports[:1]) == []
    msg = str(not_shared_error("trainer.output_dir", tmp_path, unseen_files(tmp_path, reports)))
    assert "2 file(s)" in msg and "storage every node mounts" in msg
