"""staged_dir: the one way a directory is written whole (peer_rl.files.out_paths)."""
import os

import pytest

from peer_rl.files import out_paths
from peer_rl.files.out_paths import MARKER, OutputError, staged_dir


def _tree(root):
    """{relative path: text} of every file under `root` (links not followed)."""
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _old_target(parent, name="out"):
    target = parent / name
    target.mkdir()
    (target / "model.bin").write_text("old")
    return target


def test_the_body_writes_beside_and_the_whole_directory_is_renamed_in(tmp_path):
    target = tmp_path / "out"
    with staged_dir(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".out.") and tmp.name != "out"
        assert not target.exists()           # nothing under the name until it is whole
        (tmp / "sub").mkdir()
        (tmp / "sub" / "a.txt").write_text("a")
    assert _tree(target) == {"sub/a.txt": "a"}
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("exists", ["replace", "refuse", "keep"])
def test_a_failure_mid_write_leaves_no_temp_and_the_old_target_as_it_was(tmp_path, exists):
    target = _old_target(tmp_path)
    with pytest.raises(RuntimeError, match="disk full"):
        with staged_dir(target, exists, complete=lambda d: True) as tmp:
            (tmp / "model.bin").write_text("half")
            raise RuntimeError("disk full")
    assert _tree(target) == {"model.bin": "old"}
    assert os.listdir(tmp_path) == ["out"]


def test_a_failure_with_no_target_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with staged_dir(tmp_path / "a" / "out") as tmp:
            (tmp / "x").write_text("x")
            raise KeyboardInterrupt
    assert os.listdir(tmp_path / "a") == []


def test_replace_swaps_in_the_new_copy_and_drops_the_old_one(tmp_path):
    target = _old_target(tmp_path)
    with staged_dir(target, "replace") as tmp:
        (tmp / "model.bin").write_text("new")
    assert _tree(target) == {"model.bin": "new"}
    assert os.listdir(tmp_path) == ["out"]   # the old copy set aside was removed


def test_refuse_never_writes_over_and_keeps_the_finished_copy_beside_it(tmp_path):
    target = _old_target(tmp_path, "step_4")
    with pytest.raises(OutputError) as got:
        with staged_dir(target, "refuse", refused="a checkpoint is never written over") as tmp:
            (tmp / "model.bin").write_text("new")
    assert str(got.value) == (f"{target}: exists; a checkpoint is never written over "
                              f"(this one is left in {tmp.name})")
    assert _tree(target) == {"model.bin": "old"}
    assert _tree(tmp) == {"model.bin": "new"}
    assert sorted(os.listdir(tmp_path)) == sorted(["step_4", tmp.name])


def test_refuse_takes_an_empty_directory_at_most(tmp_path):
    (tmp_path / "step_4").mkdir()
    with staged_dir(tmp_path / "step_4", "refuse") as tmp:
        (tmp / "state.json").write_text("{}")
    assert _tree(tmp_path / "step_4") == {"state.json": "{}"}


def test_keep_leaves_a_complete_copy_another_process_finished_first(tmp_path):
    target = _old_target(tmp_path)
    with staged_dir(target, "keep", complete=lambda d: (d / "model.bin").exists()) as tmp:
        (tmp / "model.bin").write_text("ours")
    assert _tree(target) == {"model.bin": "old"}
    assert os.listdir(tmp_path) == ["out"]


def test_keep_raises_the_rename_error_over_an_incomplete_copy(tmp_path):
    target = _old_target(tmp_path)
    with pytest.raises(OSError):
        with staged_dir(target, "keep", complete=lambda d: False) as tmp:
            (tmp / "model.bin").write_text("ours")
    assert _tree(target) == {"model.bin": "old"}
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("exists", ["replace", "refuse"])
def test_a_link_at_the_target_is_never_followed(tmp_path, exists):
    victim = tmp_path / "theirs"
    victim.mkdir()
    (victim / "model.bin").write_text("their file")
    link = tmp_path / "out"
    link.symlink_to(victim)
    with pytest.raises(OutputError, match=f"^{link}: exists"):
        with staged_dir(link, exists) as tmp:
            (tmp / "model.bin").write_text("new")
    assert os.readlink(link) == str(victim)
    assert _tree(victim) == {"model.bin": "their file"}
    left = sorted(os.listdir(tmp_path))
    assert left == (["out", "theirs"] if exists == "replace" else sorted(["out", "theirs", tmp.name]))


def test_the_tree_is_on_disk_before_it_is_renamed_in(tmp_path, monkeypatch):
    from peer_rl.files import durable

    synced = []                          # (what was fsynced, what its parent held then)
    monkeypatch.setattr(durable, "fsync_tree",
                        lambda d: synced.append((d.name, os.listdir(d.parent))))
    for name, exists in (("a", "replace"), ("b", "refuse"), ("c", "keep")):
        (tmp_path / name).mkdir()
        with staged_dir(tmp_path / name / "out", exists, complete=lambda d: True) as tmp:
            (tmp / "x").write_text("x")
        assert synced == [(tmp.name, [tmp.name])]   # before the rename: no `out` yet
        assert _tree(tmp_path / name / "out") == {"x": "x"}
        synced.clear()
    with staged_dir(tmp_path / "adapter", "refuse", durable=False) as tmp:
        (tmp / "x").write_text("x")
    assert synced == [] and _tree(tmp_path / "adapter") == {"x": "x"}


def test_a_failed_swap_puts_the_old_target_and_the_users_files_back(tmp_path, monkeypatch):
    """The rename of the new copy into place fails: the old output and a user's note that was
    being carried into the new one are where they were, and no temp is left."""
    target = tmp_path / "idx"
    with staged_dir(target, command="index build") as tmp:
        (tmp / "index.json").write_text("1")
    (target / "notes.txt").write_text("mine")
    real = os.rename

    def rename(src, dst):
        if str(dst) == str(target) and ".idx." in str(src) and str(src).endswith(".tmp"):
            raise OSError("injected")
        real(src, dst)

    monkeypatch.setattr(out_paths.os, "rename", rename)
    with pytest.raises(OSError, match="injected"):
        with staged_dir(target, command="index build") as tmp:
            (tmp / "index.json").write_text("2")
    monkeypatch.undo()
    assert _tree(target) == {MARKER: (target / MARKER).read_text(), "index.json": "1",
                             "notes.txt": "mine"}
    assert os.listdir(tmp_path) == ["idx"]


def test_an_unknown_mode_is_refused_before_anything_is_made(tmp_path):
    with pytest.raises(ValueError, match="exists='over'"):
        with staged_dir(tmp_path / "out", "over"):
            pass
    assert os.listdir(tmp_path) == []
