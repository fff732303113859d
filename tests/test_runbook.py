"""docs/reproduce-peer-rur.md, run from its own `bash` blocks at the tiny scale, in order, on the
local two-node cluster of cluster/start-local-cluster.sh (the commands join it through
RAY_ADDRESS; step 11 is a `ray job submit` to its job server): from the sample in the card's
layout to UnifiReward, GRPO, the four evaluations and the ESCRAG-R1 variant. What one step
writes is what the next one reads. The suite's end-to-end checks of the four evaluation
protocols' reports and of ESCRAG-R1's two-pass GRPO step are made on these runs."""
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from cluster_util import VENV_BIN
from eval_util import check_report

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "reproduce-peer-rur.md"


def blocks() -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), re.S | re.M)


def _exported(block: str) -> set[str]:
    return {name for line in block.splitlines() if line.startswith("export ")
            for name in re.findall(r"(?:^export |\s)([A-Z_]+)=", line)}


def test_the_two_settings_blocks_name_the_same_variables():
    paper, tiny = blocks()[:2]
    assert paper.startswith("# paper scale") and tiny.startswith("# tiny scale")
    assert _exported(paper) - {"VLLM_CPU_KVCACHE_SPACE"} == \
        _exported(tiny) - {"VLLM_CPU_KVCACHE_SPACE"}
    assert {"WORK", "DATA_IN", "S", "GRPO", "PARTIES", "RAY_JOBS"} <= _exported(paper)
    # every later block reads only what the settings and earlier blocks set
    later = "\n".join(blocks()[2:])
    used = set(re.findall(r"\$\{?([A-Z_]+)", later))
    assert used <= _exported(tiny) | {"DATA"}, used - _exported(tiny)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.e2e
@pytest.mark.long
def test_the_runbook_runs_at_the_tiny_scale(tmp_path, local_cluster):
    work = tmp_path / "work"
    script = ["set -euo pipefail"]
    for i, block in enumerate(blocks()):
        if block.startswith("# paper scale"):
            continue
        script += [f'echo "@@ block {i} $(date +%s.%N)"', block]
    script.append('echo "@@ end $(date +%s.%N)"')
    cluster = local_cluster
    env = {**cluster.env, "WORK": str(work), "PORT": str(_free_port()),
           "RAY_ADDRESS": f"127.0.0.2:{cluster.env['RAY_PORT']}", "RAY_JOBS": cluster.dashboard,
           "PATH": f"{VENV_BIN}{os.pathsep}{cluster.env['PATH']}"}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=2400)
    marks = [line.split() for line in proc.stdout.splitlines() if line.startswith("@@ ")]
    took = {m[2]: float(n[-1]) - float(m[-1]) for m, n in zip(marks, marks[1:])}
    print(f"runbook: {time.monotonic() - t0:.0f} s; per block:", took)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    # each step handed on what the next one read
    grpo = yaml.safe_load((work / "grpo" / "config.yaml").read_text())
    assert grpo["model"]["path"] == str(work / "sft" / "final")
    assert grpo["reward_model"]["path"] == str(work / "judge" / "final")
    assert grpo["data"]["root"] == str(work / "data") and grpo["algorithm"]["rur"]["enable"]
    assert (work / "judge" / "final" / "judge_template.json").read_text() == \
        (work / "judge_template.json").read_text()
    rm = json.loads((work / "eval" / "rm.json").read_text())
    assert rm["model"] == str(work / "judge" / "final")
    for name in ("esc", "sage", "safety", "diversity"):
        report = json.loads((work / "eval" / name / "report.json").read_text())
        assert report["manifest"]["parties"]["model"]["url"].startswith("http://127.0.0.1:")
    div = json.loads((work / "eval" / "diversity" / "report.json").read_text())
    assert div["summary"]["judge_reward"]["model"] == str(work / "judge" / "final")
    # EVAL_ARGS: limit=1, esc.rounds=2, diversity.n=2
    for name in ("esc", "sage", "safety", "diversity"):
        check_report(work / "eval" / name, name, 1, proc.stdout + proc.stderr, esc_rounds=2,
                     diversity_n=2)
    escrag = yaml.safe_load((work / "escrag" / "config.yaml").read_text())
    assert escrag["model"]["path"] == str(work / "escrag_sft" / "final")
    assert escrag["retrieval"]["index"] == str(work / "index")
    assert (work / "escrag" / "final" / "config.json").is_file()
    assert "succeeded" in proc.stdout + proc.stderr
    _check_escrag_step(work, proc.stdout + proc.stderr)


def _check_escrag_step(work: Path, written: str) -> None:
    """ESCRAG-R1's one GRPO step (GRPO_ARGS: 2 prompts, rollout.n 4 in escrag_r1_tiny): two
    passes with a real faiss index of the sample's 152 exemplars, the refined replies alone
    trained (retrieval.train_initial=false), their rewards the step's refined mean."""
    # `peer-rl index build`'s line; the run's pools line
    assert "152 exemplar(s) from" in written and "retrieval x1" in written
    assert json.loads((work / "index" / "index.json").read_text())["count"] == 152
    (rec,) = [json.loads(x) for x in (work / "escrag" / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(x) for x in (work / "escrag" / "samples.jsonl").read_text().splitlines()]
    assert rec["step"] == 1 and len(samples) == 2 * 4 and {s["step"] for s in samples} == {1}
    assert rec["reward/refined_mean"] == pytest.approx(
        sum(s["reward"] for s in samples) / len(samples), rel=1e-9)
    assert rec["retrieval/exemplars_per_query"] == 3.0 and rec["timing_s/retrieval"] > 0
    # the prompts come from dialogues the corpus also holds: their own turns are passed over
    # (the same seeker turn makes them the nearest neighbours)
    assert rec["retrieval/excluded_per_query"] > 0 and rec["timing_s/rollout_refined"] > 0
    assert rec["reward/refined_minus_initial"] == pytest.approx(
        rec["reward/refined_mean"] - rec["reward/initial_mean"], abs=1e-9)
