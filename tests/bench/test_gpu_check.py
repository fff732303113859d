"""benchmarks/gpu_check.py --smoke: the GPU check's four parts run on CPU with tiny shapes, in
processes where Ray and vLLM cannot be imported (the GPU machine has neither), so a typo costs a
test run rather than the GPU's minutes. Each part's record is read back and its figures checked
against what they must be: log-probs of packed and right-padded rows equal, the frames moving
their rows only, the adapter count worked out by hand, bytes equal after the sync's packing,
the planner's parameter count and master weights by hand."""
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
# on PYTHONPATH, so the script and every part's process import it first: `import ray` and
# `import vllm` (and their submodules) fail as on a machine without them
BLOCKER = '''import sys


class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ray", "vllm"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by test_gpu_check)",
                                      name=name)
        return None


sys.meta_path.insert(0, _Absent())
'''


def _env(tmp: Path) -> dict:
    block = tmp / "block"
    block.mkdir(exist_ok=True)
    (block / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    path = [str(block), str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    return os.environ | {"PYTHONPATH": os.pathsep.join(path)}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_check")
    env = _env(tmp)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp / "out")],
                          env=env, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - t0
    records = {p.stem: json.loads(p.read_text(encoding="utf-8"))
               for p in (tmp / "out").glob("*.json")}
    print(f"gpu_check --smoke: {seconds:.1f} s")     # shown with -s; never asserted
    return proc, records, env


@pytest.mark.e2e
def test_ray_and_vllm_are_unimportable_in_the_smoke_runs_processes(smoke):
    _, _, env = smoke
    for module in ("ray", "vllm.platforms"):
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "blocked by test_gpu_check" in proc.stderr, proc.stderr


@pytest.mark.e2e       # the smoke run: FSDP2 on gloo in four processes
def test_every_part_runs_and_passes_its_checks(smoke):
    proc, records, _ = smoke
    assert sorted(records) == ["lora", "memory", "vl_policy", "weight_sync"], proc.stderr[-3000:]
    for name, rec in records.items():
        assert rec["ok"], f"{name}: {rec['error']}"
        assert rec["checks"] and all(rec["checks"].values()) and rec["error"] is None
    assert proc.returncode == 0, proc.stdout[-3000:]
    table = [ln for ln in proc.stdout.splitlines() if ln[:2] in ("a ", "b ", "c ", "d ")]
    assert [ln.split()[1:3] for ln in table] == [[n, "yes"] for n in
                                                 ("vl_policy", "lora", "weight_sync", "memory")]


@pytest.mark.e2e
def test_vl_policy_figures(smoke):
    f = smoke[1]["vl_policy"]["figures"]
    # float32: packed rows give the padded rows' log-probs
    assert f["f32_packed_vs_padded_max"] < 1e-5
    # two rows with two 64 x 64 frames: 56 x 56 after the processor, 16 patches, 4 tokens each
    assert f["image_tokens"] == 2 * 2 * 4
    assert f["image_rows_change_max"] > 1e-3 and f["text_rows_change_max"] < 1e-6
    assert math.isfinite(f["grad_norm"]) and f["grad_norm"] > 0 and f["skipped_steps"] == 0
    assert f["moved_max"] > 0 and f["f32_mean_logp"] < 0


@pytest.mark.e2e
def test_lora_figures(smoke):
    f = smoke[1]["lora"]["figures"]
    # the tiny policy's 2 decoder layers, hidden 128, MLP 256, 2 heads of 64 (no GQA), r = 8:
    # q, k, v, o 8 x (128 + 128) each, gate and up 8 x (128 + 256), down 8 x (256 + 128)
    per_layer = 8 * (4 * 256 + 3 * 384)
    assert f["trainable"] == f["planner_lora_params"] == 2 * per_layer == 34816
    assert f["policy_vs_ref_before"] == 0.0 and f["ref_drift"] == 0.0
    assert f["policy_moved"] > 1e-4
    # what the step changed: the B of each of the 2 x 7 adapted layers, and nothing else (A's
    # gradient is B^T times the output's gradient: 0 while B is 0, so AdamW leaves A)
    assert f["tensors_changed"] == 2 * 7
    assert f["merged_export_vs_worker"] < 1e-4 and f["peft_adapter_vs_worker"] < 1e-4


@pytest.mark.e2e
def test_weight_sync_figures(smoke):
    f = smoke[1]["weight_sync"]["figures"]
    assert f["one_bucket_mismatched"] == f["small_buckets_mismatched"] == []
    assert f["worker_mismatched"] == []
    assert f["one_bucket_buckets"] == 1 and f["small_buckets_buckets"] > 3
    assert f["worker_backend"] == "gloo" and f["worker_tensors"] > 0


@pytest.mark.e2e
def test_memory_figures(smoke):
    f = smoke[1]["memory"]["figures"]
    # the smoke shape: untied embeddings and output 2 x 4096 x 128; each of 4 layers attention
    # 4 x 128^2 + 3 x 128 (q, k, v biases), MLP 3 x 128 x 256, two norms; the final norm
    layer = 4 * 128 ** 2 + 3 * 128 + 3 * 128 * 256 + 2 * 128
    params = 2 * 4096 * 128 + 4 * layer + 128
    assert f["layers"] == 4 and f["params"] == params == 1_706_624
    assert f["estimate_parts_gib"]["master weights"] == round(4 * params / 2**30, 3)
    assert f["recompute"] is True and math.isfinite(f["grad_norm"]) and f["grad_norm"] > 0
    assert f["ratio"] is None and f["rss_gib"] > 0


def test_the_layer_count_is_the_most_the_estimate_fits():
    """Part (d)'s choice at the Qwen2.5-7B shape: L layers fit the budget and L + 1 do not."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    from peer_rl.planning import memory
    from peer_rl.planning.shapes import NAMED, text_params
    from peer_rl.config.worker_settings import LoRASettings

    shape = {k: v for k, v in NAMED["Qwen2.5-7B"].items() if k != "max_position_embeddings"}
    _, actor = gc.memory_settings(4096, 1024, "bfloat16")
    budget = 60 * 2**30
    layers, est = gc.fit_layers(shape, actor, budget, 79.2, memory.GPU)

    def total(n):
        config = {**shape, "num_hidden_layers": n}
        return memory.policy_rank(config, text_params(config), 0, actor, LoRASettings(), 79.2,
                                  memory.GPU).total

    assert 0 < layers < 28 and est.total == total(layers) <= budget < total(layers + 1)
    assert gc.fit_layers(shape, actor, 1.0, 79.2, memory.GPU) == (0, None)
