"""`peer-rl sft` and `peer-rl train-rm` with model.lora.rank > 0, as a user runs them: the stage
trains adapters only, a resume at another world size continues them, and final/ is the merged
model plus adapter/ in PEFT's format (PeftModel on the base computes what the merged model
does)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.e2e


def _stage(command: str, out: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "peer_rl.cli", command,
                           f"trainer.output_dir={out}", "ray.address=local", "data.max_rows=16",
                           *args], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, tiny_models):
    out = tmp_path_factory.mktemp("sft_lora")
    common = ("recipe=sft_tiny", f"model.path={tiny_models['policy']}", "model.lora.rank=8",
              "trainer.save_freq=1", "trainer.lr=1e-2", "trainer.warmup_steps=0")
    _stage("sft", out, *common, "trainer.total_steps=2", "trainer.world_size=2")
    resumed = _stage("sft", out, *common, "trainer.total_steps=3", "trainer.world_size=1")
    return out, resumed


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_sft_final_is_the_merged_adapter_and_only_the_adapted_weights_moved(sft_run, tiny_models):
    from peft import PeftModel
    from safetensors import safe_open

    from peer_rl.workers.fsdp import load_pretrained

    out, resumed = sft_run
    assert "resumed from step_000002 (step 2/3)" in resumed
    final = out / "final"
    assert (final / "adapter" / "adapter_config.json").is_file()
    base_dir = Path(tiny_models["policy"])
    with safe_open(str(final / "model.safetensors"), "pt") as merged, \
            safe_open(str(base_dir / "model.safetensors"), "pt") as base:
        assert set(merged.keys()) == set(base.keys())
        moved = {k for k in base.keys()
                 if not torch.equal(merged.get_tensor(k), base.get_tensor(k))}
    # PEFT's all-linear: the decoder's projections; embeddings, norms and the tower untouched
    assert moved and all(k.endswith("proj.weight") and "visual" not in k for k in moved)
    ids = torch.arange(3, 40)[None]
    adapted = PeftModel.from_pretrained(load_pretrained(str(base_dir)), str(final / "adapter"))
    torch.testing.assert_close(_logits(adapted.eval(), ids),
                               _logits(load_pretrained(str(final)), ids), rtol=0, atol=1e-4)


def test_sft_checkpoints_hold_the_adapters_optimizer_state_only(sft_run):
    from safetensors import safe_open

    out = sft_run[0]
    ckpt = out / "ray_train" / "run" / "step_000003"
    names = set()
    for f in (ckpt / "optim").glob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            names |= set(fh.keys())
    # optim/<parameter>/{exp_avg, exp_avg_sq, step} of each adapter matrix, nothing else
    assert names and all(n.startswith("optim/") and (".lora_A." in n or ".lora_B." in n)
                         for n in names)


@pytest.fixture(scope="module")
def rm_run(tmp_path_factory, tiny_models):
    """Two steps at a high lr, so that the adapter moves the judge's greedy answers."""
    out = tmp_path_factory.mktemp("rm_lora")
    _stage("train-rm", out, "recipe=unifireward_tiny", f"model.path={tiny_models['judge']}",
           "model.lora.rank=4", "trainer.total_steps=2", "trainer.lr=5e-2",
           "trainer.warmup_steps=0")
    return out / "final"


def test_train_rm_with_lora_writes_a_judge_with_its_template_and_adapter(rm_run):
    for name in ("judge_template.json", "model.safetensors", "adapter/adapter_config.json",
                 "adapter/adapter_model.safetensors", "adapter/judge_template.json"):
        assert (rm_run / name).is_file(), name


def test_the_judge_engine_serves_base_plus_adapter_as_the_merged_judge(rm_run, tiny_models):
    """reward_model.lora_path: the base judge plus final/adapter answers, greedily, what the
    merged final/ answers, and not what the base alone answers."""
    from peer_rl.config.worker_settings import JudgeSettings
    from peer_rl.workers.unifireward import UnifiRewardWorker

    asks = [[{"role": "user", "content": f"Chat {i}: the seeker says they feel {w} today."}]
            for i, w in enumerate(("lonely", "anxious", "hopeless", "tired", "angry", "lost"))]
    answers = {}
    for name, args in (("adapter", (tiny_models["judge"], str(rm_run / "adapter"))),
                       ("merged", (str(rm_run), "")), ("base", (tiny_models["judge"], ""))):
        w = UnifiRewardWorker(args[0], JudgeSettings(kv_cache_gib=0.25, max_model_len=1024),
                              lora_path=args[1])
        answers[name] = w.chat(asks, max_tokens=12)
        w.close()
    assert answers["adapter"] == answers["merged"]
    assert answers["adapter"] != answers["base"]


def test_a_judge_adapter_without_its_template_is_refused_naming_the_key(rm_run, tmp_path,
                                                                        tiny_models):
    import shutil

    from peer_rl.workers.unifireward import UnifiRewardWorker

    bare = tmp_path / "adapter"
    shutil.copytree(rm_run / "adapter", bare)
    (bare / "judge_template.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"reward_model.lora_path=.*no judge_template"):
        UnifiRewardWorker(tiny_models["judge"], lora_path=str(bare))
