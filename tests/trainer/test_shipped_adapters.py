"""Shipped LoRA adapters (peer_rl.trainer.shipped_adapters), exercised on the tiny policy: a build
trains the stage and ships its adapter in bfloat16 with the inputs' digests; `use` merges it into
the base when the stage's inputs match (no training) and trains when they do not."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

STAGES = {"policy": ("sft", "sft_tiny")}


def _overrides(tiny_models, **extra):
    base = {"model.path": tiny_models["policy"], "model.lora.rank": 4, "model.lora.lora_alpha": 8,
            "trainer.total_steps": 2, "trainer.lr": 1e-2, "trainer.warmup_steps": 0,
            "trainer.world_size": 1, "data.max_rows": 8, "trainer.save_freq": 0}
    return [f"{k}={v}" for k, v in (base | extra).items()]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, tiny_models):
    from peer_rl.trainer.shipped_adapters import build_shipped_adapters

    out = tmp_path_factory.mktemp("shipped") / "adapters"
    build_shipped_adapters(out, _overrides(tiny_models), stages=STAGES)
    return out


@pytest.mark.e2e
def test_the_build_ships_a_bfloat16_adapter_with_its_inputs(shipped):
    from safetensors.torch import load_file

    manifest = json.loads((shipped / "manifest.json").read_text())
    entry = manifest["models"]["policy"]
    assert entry["recipe"] == "sft_tiny" and entry["steps"] == 2
    assert set(entry["inputs"]) == {"config", "start_model", "data", "examples"}
    tensors = load_file(str(shipped / "policy" / "adapter_model.safetensors"))
    assert tensors and all(t.dtype == torch.bfloat16 for t in tensors.values())
    config = json.loads((shipped / "policy" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["base_model_name_or_path"] == ""
    assert (shipped / "policy" / "policy_template.json").is_file()
    # every shipped file's sha256, which a later lookup holds the files against
    assert set(entry["files"]) == {p.name for p in (shipped / "policy").iterdir()}
    assert entry["files"]["adapter_model.safetensors"] == hashlib.sha256(
        (shipped / "policy" / "adapter_model.safetensors").read_bytes()).hexdigest()


@pytest.mark.e2e
def test_matching_inputs_merge_the_shipped_adapter_without_training(shipped, tiny_models,
                                                                    tmp_path, capsys):
    from safetensors.torch import load_file

    from peer_rl.trainer.shipped_adapters import SHIPPED_FROM, use_shipped

    final = use_shipped("policy", tmp_path / "sft", _overrides(tiny_models), shipped, STAGES)
    assert final == tmp_path / "sft" / "final" and (final / SHIPPED_FROM).is_file()
    assert not (tmp_path / "sft" / "ray_train").exists()          # nothing was trained
    assert "the adapter shipped with peer-rl" in capsys.readouterr().out
    assert json.loads((final / "trainer_state.json").read_text())["step"] == 2
    assert (final / "policy_template.json").is_file() and (final / "adapter").is_dir()
    # merged weights worked out by hand: W + (lora_alpha / r) B A, from the shipped tensors
    base = load_file(str(Path(tiny_models["policy"]) / "model.safetensors"))
    merged = load_file(str(final / "model.safetensors"))
    lora = load_file(str(shipped / "policy" / "adapter_model.safetensors"))
    a_keys = [k for k in lora if ".lora_A." in k]
    assert a_keys
    checked = 0
    for a_key in a_keys:
        # the module's name in memory -> in the checkpoint (Qwen2.5-VL's legacy layout)
        module = a_key.removeprefix("base_model.model.").split(".lora_A.")[0]
        name = module.replace("model.language_model.", "model.") + ".weight"
        assert name in base, (name, sorted(base)[:5])
        a = lora[a_key].float()
        b = lora[a_key.replace(".lora_A.", ".lora_B.")].float()
        torch.testing.assert_close(merged[name], base[name] + (8 / 4) * b @ a,
                                   rtol=0, atol=1e-6)
        checked += 1
    assert checked == len(a_keys)
    again = use_shipped("policy", tmp_path / "sft", _overrides(tiny_models), shipped, STAGES)
    assert again == final and "already holds the policy" in capsys.readouterr().out


@pytest.mark.e2e
def test_other_inputs_train_the_stage_instead(shipped, tiny_models, tmp_path, capsys,
                                              monkeypatch):
    """The decision: with another setting than the build's, `use` hands the stage, with the
    user's settings, to the supervised launcher (here recording the hand-off instead of
    training; the chain's test trains through this same path for real, its start model being
    another, and checks what the launcher wrote)."""
    from peer_rl.trainer.shipped_adapters import SHIPPED_FROM, use_shipped

    handed = []

    def launcher(cfg, kind):
        handed.append((cfg, kind))
        return Path(cfg.trainer.output_dir) / "final"

    monkeypatch.setattr("peer_rl.trainer.shipped_adapters.run_supervised", launcher)
    final = use_shipped("policy", tmp_path / "sft", _overrides(tiny_models, **{"trainer.lr": 5e-3}),
                        shipped, STAGES)
    out = capsys.readouterr().out
    assert "the shipped SmolLM2 policy was trained on other inputs (config differ" in out
    ((cfg, kind),) = handed
    assert (kind, cfg.recipe, cfg.trainer.lr) == ("sft", "sft_tiny", 5e-3)
    assert final == (tmp_path / "sft").resolve() / "final" and not (final / SHIPPED_FROM).exists()


@pytest.mark.e2e   # a peer-rl CLI subprocess
def test_a_bad_key_stops_use_smollm2_naming_it(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "peer_rl.cli", "models", "use-smollm2", "judge",
                           "--out", str(tmp_path / "j"), "trainer.no_such_key=1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "trainer.no_such_key" in proc.stderr and not (tmp_path / "j").exists()
