"""The run store: a killed run loses no finished case and counts none twice."""
import json

import pytest

from peer_rl.evaluation.store import RunLocked, RunMismatch, RunStore

MANIFEST = {"protocol": "esc", "settings": {"rounds": 5}, "parties": {"model": {"url": "u"}}}


def test_cases_survive_reopening(tmp_path):
    store = RunStore(tmp_path, MANIFEST)
    store.append({"id": "1", "score": 3})
    store.append({"id": "2", "score": 4})
    store.close()
    again = RunStore(tmp_path, MANIFEST)
    assert again.done("1") and again.done("2") and not again.done("3")
    assert again.records["2"] == {"id": "2", "score": 4}
    with pytest.raises(ValueError, match="already recorded"):
        again.append({"id": "1", "score": 0})


def test_a_line_cut_by_a_kill_is_dropped_and_its_case_redone(tmp_path):
    store = RunStore(tmp_path, MANIFEST)
    store.append({"id": "1"})
    with open(store.path, "a", encoding="utf-8") as fh:
        fh.write('{"id": "2", "turns": [{"seek')          # the process died mid-write
    store.close()
    inode = store.path.stat().st_ino
    again = RunStore(tmp_path, MANIFEST)
    # repaired beside and renamed into place (a crash during the repair loses nothing)
    assert store.path.stat().st_ino != inode and not (tmp_path / "cases.jsonl.tmp").exists()
    assert again.torn_lines == 1 and list(again.records) == ["1"]
    again.append({"id": "2"})
    ids = [json.loads(x)["id"] for x in store.path.read_text().splitlines()]
    assert ids == ["1", "2"]


def test_a_last_record_without_its_newline_is_kept_and_the_next_append_stands_apart(tmp_path):
    """A kill between a record and its newline: the record is whole, so it counts; the file is
    given its newline on open, or the next append would be glued to it and the open after that
    would call the file damaged."""
    store = RunStore(tmp_path, MANIFEST)
    store.close()
    store.path.write_text('{"id": "1"}\n{"id": "2"}')
    again = RunStore(tmp_path, MANIFEST)
    assert list(again.records) == ["1", "2"] and again.torn_lines == 0
    again.append({"id": "3"})
    again.close()
    assert store.path.read_text() == '{"id": "1"}\n{"id": "2"}\n{"id": "3"}\n'
    assert list(RunStore(tmp_path, MANIFEST).records) == ["1", "2", "3"]


def test_a_damaged_line_in_the_middle_is_an_error_naming_it(tmp_path):
    store = RunStore(tmp_path, MANIFEST)
    store.path.write_text('{"id": "1"}\nnot json\n{"id": "3"}\n')
    store.close()
    with pytest.raises(ValueError, match=r"cases.jsonl:2: not a JSON line"):
        RunStore(tmp_path, MANIFEST)


def test_other_settings_are_refused_naming_what_differs(tmp_path):
    RunStore(tmp_path, MANIFEST)
    with pytest.raises(RunMismatch, match="settings differ"):
        RunStore(tmp_path, {**MANIFEST, "settings": {"rounds": 3}})


@pytest.mark.e2e   # a child process
def test_a_second_process_on_the_same_run_is_refused_naming_the_holder(tmp_path):
    """Issue 24.6: two processes appending to one cases.jsonl made the next open refuse the
    directory ("appears twice"); now the second is refused up front."""
    import subprocess
    import sys
    import time

    code = ("import sys, time; from peer_rl.evaluation.store import RunStore; "
            f"s = RunStore(sys.argv[1], {MANIFEST!r}); print('open', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "open"
        with pytest.raises(RunLocked, match=f"in use by another process \\(pid {child.pid}\\)"):
            RunStore(tmp_path, MANIFEST)
    finally:
        child.kill()
        child.wait()
    time.sleep(0.1)
    RunStore(tmp_path, MANIFEST).append({"id": "1"})   # a killed holder releases the lock


def test_the_same_process_must_close_a_store_before_reopening(tmp_path):
    store = RunStore(tmp_path, MANIFEST)
    with pytest.raises(RunLocked):
        RunStore(tmp_path, MANIFEST)
    store.close()
    RunStore(tmp_path, MANIFEST).close()
