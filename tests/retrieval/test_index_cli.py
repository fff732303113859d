"""`peer-rl index build` and `query` as a user runs them."""
import subprocess
import sys

import pytest

from peer_rl.data.sample import sample_root

pytestmark = pytest.mark.e2e   # peer-rl CLI subprocesses


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "peer_rl.cli", "index", *args],
                          capture_output=True, text=True, timeout=300)


def test_build_from_the_sample_then_query(tmp_path):
    proc = _cli("build", str(sample_root()), "--out", str(tmp_path / "idx"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "152 exemplar(s)" in proc.stdout and "flat index" in proc.stdout
    proc = _cli("query", str(tmp_path / "idx"), "我又差几分没考上研究生，不敢告诉爸妈。", "-k", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("0 exemplar(s) of the query's own dialogue passed over")
    assert proc.stdout.count("score ") == 2 and "(zh" in lines[1]
    # the first seeker turn of a sample dialogue: its own exemplars are passed over
    first = "我家狗狗昨天走了，它陪了我十二年，从我上小学就在。我在学校，连最后一面都没见到。"
    proc = _cli("query", str(tmp_path / "idx"), first, "-k", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[0]) >= 1, proc.stdout   # of that dialogue's six turns
    assert proc.stdout.count("score ") == 3 and "zh-08-" not in proc.stdout


def test_bad_rows_are_named_and_nothing_is_written(tmp_path):
    bad = tmp_path / "exemplars"
    bad.mkdir()
    (bad / "x.jsonl").write_text('{"id": "a", "language": "en", "history": ["hi"]}\n')
    proc = _cli("build", str(tmp_path), "--out", str(tmp_path / "idx"))
    assert proc.returncode == 2 and "x.jsonl:1: response: missing" in proc.stderr
    assert not (tmp_path / "idx").exists()
