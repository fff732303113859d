"""`peer-rl eval ...` and `peer-rl chat` as a user runs them, against a real vLLM server and a
local checkpoint, with the tiny policy playing every party (its answers are mostly unparseable:
they must be counted, never crash the run). Each protocol's report, figures and silence about
the dialogues are checked on the four runs of docs/reproduce-peer-rur.md (tests/test_runbook.py,
tests/eval_util.py); here: resumption, comparison, chat, local checkpoints and the CCJ ladder."""
import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.e2e

SMALL = ["model.max_tokens=48", "seeker.max_tokens=24", "judge.max_tokens=24", "esc.rounds=2",
         "sage.max_turns=3", "diversity.n=2"]


def _cmd(protocol, out, url, *extra):
    parties = [f"{r}.url={url}" for r in ("model", "seeker", "judge")]
    return [sys.executable, "-m", "peer_rl.cli", "eval", protocol, "--out", str(out),
            *parties, *SMALL, *extra]


def _run(cmd, timeout=600, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, **kw)


def _cases(out):
    return [json.loads(x) for x in (out / "cases.jsonl").read_text().splitlines()]


def test_killing_the_server_mid_run_then_rerunning_finishes_every_case_once(vllm_server,
                                                                            server_url, tmp_path):
    out = tmp_path / "sage"
    cmd = _cmd("sage", out, server_url, "batch_cases=1", "sage.max_turns=4",
               "model.max_retries=1", "seeker.max_retries=1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cases_file = out / "cases.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if cases_file.exists() and cases_file.read_text().count("\n") >= 1:
            vllm_server.stop()
            break
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=300)
    assert not vllm_server.running(), "the run ended before the server could be killed"
    assert proc.returncode == 3, stdout[-2000:] + stderr[-3000:]
    assert "unreachable" in stderr and "rerun the same command" in stderr
    first = [c["id"] for c in _cases(out)]
    assert 1 <= len(first) < 3

    vllm_server.start()
    proc = _run(cmd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    ids = [c["id"] for c in _cases(out)]
    assert sorted(ids) == ["sample-en-1", "sample-zh-1", "sample-zh-2"]   # each exactly once
    assert ids[:len(first)] == first
    summary = json.loads((out / "report.json").read_text())["summary"]
    assert summary["resumed_cases"] == len(first) and summary["cases"] == 3


def test_compare_two_prompt_styles_and_chat_in_the_terminal(server_url, tmp_path):
    runs = []
    for style in ("peer", "chat"):
        out = tmp_path / style
        proc = _run(_cmd("diversity", out, server_url, "limit=2", f"model.prompt={style}"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(str(out))
    proc = _run([sys.executable, "-m", "peer_rl.cli", "eval", "compare", *runs, "--out",
                 str(tmp_path / "cmp")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert f"{server_url} (peer)" in table and f"{server_url} (chat)" in table
    assert (tmp_path / "cmp" / "compare_diversity_metrics.png").exists()

    proc = _run([sys.executable, "-m", "peer_rl.cli", "chat", server_url, "--max-tokens", "48"],
                input="I failed my exam again.\n/reasoning\nAnd my parents are angry.\n/quit\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("supporter> ") == 2
    assert "(reasoning shown)" in proc.stdout and proc.stdout.count("[reasoning]") == 1


def test_a_local_checkpoint_serves_the_model_and_the_judge(tiny_models, tmp_path):
    out = tmp_path / "safety"
    cmd = [sys.executable, "-m", "peer_rl.cli", "eval", "safety", "--out", str(out),
           f"model.path={tiny_models['policy']}", f"judge.path={tiny_models['policy']}",
           "model.max_tokens=48", "judge.max_tokens=24", "model.kv_cache_gib=0.5", "limit=3"]
    proc = _run(cmd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    s = json.loads((out / "report.json").read_text())["summary"]
    assert s["cases"] == 3 and s["overall"]["judged"] + s["overall"]["unparsed"] == 3
    # the judge answered in the schema: with structured output every verdict parses
    assert s["overall"]["unparsed"] == 0
    # a rerun on the finished directory runs nothing and reports the same
    again = _run(cmd)
    assert again.returncode == 0 and "eval safety" not in again.stderr
    assert json.loads((out / "report.json").read_text())["summary"]["overall"] == s["overall"]


def test_ccj_ladder_with_and_without_rag_inference_then_rag_chat(server_url, tmp_path):
    """`peer-rl index build`, then a two-rung ladder (escrag prompt; + RAG) of `eval ccj`
    against the server, then `peer-rl chat --rag`: the exemplars each RAG case used are what
    the index returns for (seeker's last turn, that case's own initial reply)."""
    from peer_rl.data.bundled import sample_root
    from peer_rl.prompts.escrag import parse_reasoned
    from peer_rl.retrieval.index import ExemplarIndex, Query, exemplar_key
    from peer_rl.models.encoders import load_embedding_model

    index = tmp_path / "index"
    proc = _run([sys.executable, "-m", "peer_rl.cli", "index", "build", str(sample_root()),
                 "--out", str(index)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ladder = tmp_path / "ladder.yaml"
    ladder.write_text(
        "protocol: ccj\npaths: {url: '<server>', index: '<index>'}\n"
        "common: ['model.url=${paths.url}', 'judge.url=${paths.url}', model.prompt=escrag,\n"
        "         model.max_tokens=48, judge.max_tokens=64, limit=2]\n"
        "rungs:\n  - {name: plain, overrides: []}\n"
        "  - {name: rag, overrides: ['rag.index=${paths.index}', rag.k=2]}\n")
    out = tmp_path / "ladder"
    cmd = [sys.executable, "-m", "peer_rl.cli", "eval", "ladder", str(ladder), "--out", str(out)]
    proc = _run(cmd + [f"paths.url={server_url}"])
    assert proc.returncode == 2 and "set paths.index=DIR" in proc.stderr   # a path left unset
    proc = _run(cmd + [f"paths.url={server_url}", f"paths.index={index}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    plain, rag = _cases(out / "plain"), _cases(out / "rag")
    assert len(plain) == len(rag) == 2 and not any("error" in c for c in plain + rag)
    assert not any("exemplars" in c for c in plain)
    idx = ExemplarIndex(index)
    encoder = load_embedding_model(idx.info["embedding_model"])
    for c in rag:
        first = parse_reasoned(c["initial_raw"]).reply
        vec = encoder.encode([exemplar_key(c["history"], first)])
        assert c["exemplars"] == [h.exemplar["response"] for h in idx.search_vectors(
            vec, 2, [Query(c["history"])]).hits[0]]
    for run in ("plain", "rag"):
        s = json.loads((out / run / "report.json").read_text())["summary"]
        assert all(d["n"] + d["unparsed"] == 2 for d in s["dimensions"].values())
        assert s["rag"] is (run == "rag")
    table = (out / "compare.md").read_text()
    assert "| plain |" in table and "| rag |" in table and "Strategy-Client Fit" in table

    proc = _run([sys.executable, "-m", "peer_rl.cli", "chat", server_url, "--rag", str(index),
                 "--rag-k", "2", "--max-tokens", "48", "--show-reasoning"],
                input="I lost my job and I can't tell my wife.\n/quit\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "escrag prompt, RAG from retrieval" in proc.stdout
    assert proc.stdout.count("[exemplar ") == 2 and proc.stdout.count("supporter> ") == 1
