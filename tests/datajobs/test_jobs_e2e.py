"""`peer-rl data ...` as a user runs it, against a real vLLM OpenAI-compatible server on
127.0.0.1 serving the tiny policy for every party. Its answers are nonsense, constrained to the
jobs' JSON schemas: these tests check the plumbing, the counting, the reports and resumption."""
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from peer_rl.data.bundled import sample_root

pytestmark = pytest.mark.e2e


def _cli(*args):
    return [sys.executable, "-m", "peer_rl.cli", "data", *map(str, args)]


def _run(cmd, timeout=900):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def _summary(path):
    return json.loads(path.read_text())["summary"]


def _check(root):
    _ok(_run(_cli("check", root)))


def _hand_written_personas(out, n):
    """personas.jsonl as `data personas` writes it, for its first n seekers, one cluster per
    language."""
    from peer_rl.datajobs.config import load_job_config
    from peer_rl.datajobs.personas import PERSONAS_FILE, seekers_of

    # the seekers `data rewrite` reads (its parties' addresses only pass the config check)
    cfg = load_job_config("rewrite", [f"{r}.url=http://127.0.0.1:9/v1" for r in ("judge",
                                                                              "writer")])
    seekers, _, _ = seekers_of(sample_root(), cfg)
    out.mkdir(parents=True)
    (out / PERSONAS_FILE).write_text("".join(json.dumps(
        {"seeker": sk.id, "language": sk.language, "cluster": f"{sk.language}-0",
         "description": "Speaks in short sentences and asks direct questions."}) + "\n"
        for sk in seekers[:n]), encoding="utf-8")
    return out


def test_each_job_against_an_openai_compatible_server(server_url, tmp_path):
    parties = [f"{r}.url={server_url}" for r in ("judge", "writer", "client", "counselor")]
    # enough tokens for the tiny model to close the counsellor's and the judge's JSON
    small = ["judge.max_tokens=200", "writer.max_tokens=160", "client.max_tokens=24",
             "counselor.max_tokens=700"]

    _ok(_run(_cli("filter", sample_root(), "--out", tmp_path / "f", "limit=6", *parties[:1],
                  *small[:1])))
    s = _summary(tmp_path / "f/_jobs/filter/report.json")
    assert s["judged"] == 6 and s["kept"] + s["removed"] + s["unparsed"] == 6
    assert s["rows_out"] == s["rows_in"] - s["removed"] - s["unparsed"]
    _check(tmp_path / "f")

    _ok(_run(_cli("personas", sample_root(), "--out", tmp_path / "p", "limit=4", parties[1],
                  small[1])))
    s = _summary(tmp_path / "p/report.json")
    assert s["seekers"] == 4 and s["personas"] + s["unparsed"] == 4
    assert sum(s["cluster_sizes"].values()) == s["personas"]

    # the tiny writer's answers may all be cut off (no persona): rewrite then reads personas
    # written here for the same seekers, so that it always runs
    personas = tmp_path / "p" if s["personas"] else _hand_written_personas(tmp_path / "ph", 4)
    print(f"rewrite reads {personas}")
    _ok(_run(_cli("rewrite", sample_root(), "--personas", personas, "--out",
                  tmp_path / "r", *parties[:2], *small[:2])))
    r = _summary(tmp_path / "r/_jobs/rewrite/report.json")
    assert r["cases"] == (s["personas"] or 4)
    assert r["rewrites_unparsed"] + r["filter_kept"] + r["filter_removed"] \
        + r["filter_unparsed"] == r["cases"]
    _check(tmp_path / "r")

    _ok(_run(_cli("preference", "--out", tmp_path / "e", "limit=2", "preference.turns=1",
                  "preference.candidates=2", *parties[2:], parties[0], *small)))
    s = _summary(tmp_path / "e/_jobs/preference/report.json")
    assert s["dialogues"] == 2 and s["errors"] == 0
    # one round each, stage by stage; a round whose stage note or pick fails writes no reply
    o = s["round_outcomes"]
    assert s["candidates"] == 2 * (2 - o["no stage note"] - o["no stage pick"])
    rounds = sum(s["round_outcomes"].values())
    assert s["candidates_unparsed"] + s["candidates_unscored"] <= 4 and rounds <= 2
    assert sum(s["exemplars"].values()) == s["round_outcomes"]["pair"] \
        + s["round_outcomes"]["no dominance"]
    _check(tmp_path / "e")

    _ok(_run(_cli("rounds", sample_root(), "--out", tmp_path / "g")))
    _check(tmp_path / "g")
    _assert_rounds_kept(sample_root() / "grpo", tmp_path / "g" / "grpo", per_dialogue=3)

    _ok(_run(_cli("cold-start", sample_root(), "--out", tmp_path / "c", "cold_start.count=3",
                  f"teacher.url={server_url}", "teacher.max_tokens=64")))
    s = _summary(tmp_path / "c/_jobs/cold_start/report.json")
    assert s["asked"] == 3 and s["demonstrations"] + s["unparsed"] == 3
    # cold_start.refined_share 0.5 over 3 draws: the 2nd teaches pass 2 (floor(2 x 0.5) = 1),
    # its exemplars retrieved from an index of the root's train exemplars by the real encoder
    assert {p: v["asked"] for p, v in s["passes"].items()} == {"initial": 2, "refined": 1}
    _check(tmp_path / "c")


def test_killing_a_job_and_rerunning_finishes_every_row_once(server_url, tmp_path):
    out = tmp_path / "f"
    cmd = _cli("filter", sample_root(), "--out", out, f"judge.url={server_url}",
               "judge.max_tokens=96", "limit=16", "batch_cases=2")
    store = out / "_jobs/filter/cases.jsonl"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if store.exists() and len(store.read_text().splitlines()) >= 4:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the job ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    done = len(store.read_text().splitlines())
    assert 4 <= done < 16 and not (out / "grpo").exists()     # no output before the end
    _ok(_run(cmd))
    ids = [json.loads(x)["id"] for x in store.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 16
    s = _summary(out / "_jobs/filter/report.json")
    assert s["judged"] == 16 and s["rows_out"] == s["rows_in"] - s["removed"] - s["unparsed"]
    rows_out = sum(len(f.read_text().splitlines()) for f in (out / "grpo").glob("*.jsonl"))
    assert rows_out == s["rows_out"]
    _check(out)


def _assert_rounds_kept(src: Path, out: Path, per_dialogue: int) -> None:
    """Every kept row is one of the input file's lines, unchanged and once; each dialogue (as the
    sample's source dialogues name it: peer_rl.data.bundled.targets, not the job's grouping)
    keeps min(per_dialogue, its rounds)."""
    from peer_rl.data.bundled import targets

    named = {(t["text"], tuple(x["content"] for x in t["history"])): t["dialogue"]
             for lang in ("en", "zh") for t in targets(lang)}

    def dialogue(line: str) -> str:
        r = json.loads(line)
        return named[r["solution"], tuple(t["content"] for t in r["history"])]

    files = sorted(p.name for p in src.glob("*.jsonl"))
    assert files and files == sorted(p.name for p in out.glob("*.jsonl"))
    for name in files:
        given = (src / name).read_text(encoding="utf-8").splitlines()
        kept = (out / name).read_text(encoding="utf-8").splitlines()
        assert set(kept) <= set(given) and len(kept) == len(set(kept)), name
        rounds = Counter(dialogue(x) for x in given)
        assert Counter(dialogue(x) for x in kept) == {
            d: min(per_dialogue, n) for d, n in rounds.items()}, name
        assert len(kept) < len(given), name          # some dialogue had more rounds to drop
