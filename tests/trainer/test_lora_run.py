"""`peer-rl train model.lora.rank=8` as a user runs it: stopped (SIGTERM) after step 2, then
`resume=auto` to a third; the checkpoint holds the adapters only, final/ is the merged model plus
adapter/ in PEFT's format, and PeftModel on the base model computes what the merged export
computes. The run is tests/trainer/conftest.py's async_lora_run, shared with
tests/trainer/test_run_async.py (it also runs trainer.async_training.staleness=1 and dynamic
sampling, which none of these claims depends on)."""
import math
from pathlib import Path

import pytest
import torch
from train_util import metrics as _metrics, train as _train

pytestmark = pytest.mark.e2e


@pytest.fixture
def lora_run(async_lora_run):
    """The output directory, the first run's stdout, the resumed run's stdout."""
    run = async_lora_run
    return run["out"], run["first"]["stdout"], run["resumed"].stdout


def test_a_lora_run_says_the_reference_is_free_checkpoints_adapters_and_resumes(lora_run):
    from safetensors import safe_open

    out, first, second = lora_run
    assert "reference: the policy with its LoRA adapters off (model.lora.rank=8" in first
    assert "resuming from" in second and "(step 2)" in second
    assert [m["step"] for m in _metrics(out)] == [1, 2, 3]
    names = set()
    for f in (out / "checkpoints" / "step_3" / "policy" / "dcp").glob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            names |= {n for n in fh.keys() if n.startswith("model/")}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)


def test_final_is_the_merged_model_and_its_adapter_loads_in_peft(lora_run, grpo_models):
    from peft import PeftModel

    from peer_rl.workers.fsdp import load_pretrained

    out = lora_run[0]
    final = Path(out) / "final"
    merged = load_pretrained(str(final))
    base = load_pretrained(grpo_models["policy"])
    adapted = PeftModel.from_pretrained(load_pretrained(grpo_models["policy"]),
                                        str(final / "adapter")).eval()
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        want, got, plain = (m(input_ids=ids).logits for m in (merged, adapted, base))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert (want - plain).abs().max() > 1e-5              # three steps moved the adapters


def test_cpu_engines_get_merged_weights_by_default(lora_run):
    """model.lora.merge=auto on CPU engines sends merged weights: every step's sync/bytes is
    the size, in the engines' dtype (memory.json records it: 4 bytes a value in float32, 2 in
    bfloat16), of what the engines receive, worked out from the merged export: every tensor
    but the frozen vision tower's (its patch merger, the aligner, is sent), the tied output
    layer once. (With merge=false a sync is the adapter alone:
    test_a_run_from_a_saved_adapter_syncs_it_before_the_first_rollout.)"""
    import json

    from safetensors import safe_open

    out = lora_run[0]

    def value_bytes(run: Path) -> int:
        dtype = json.loads((run / "memory.json").read_text())["dtype"]["rollout"]
        return {"float32": 4, "bfloat16": 2}[dtype]

    with safe_open(str(out / "final" / "model.safetensors"), "pt") as fh:
        text = sum(math.prod(fh.get_slice(k).get_shape()) * value_bytes(out) for k in fh.keys()
                   if "visual" not in k or ".merger." in k)
    assert [m["sync/bytes"] for m in _metrics(out)] == [text] * 3


def test_a_run_from_a_saved_adapter_syncs_it_before_the_first_rollout(tmp_path, grpo_models):
    """model.lora.lora_adapter_path: the engines start on the base model, so the adapter is
    synced before step 1. With staleness 1 the step's behaviour log-probs (the engine's) meet
    the policy's own log-probs of the same tokens: measured 0.0012 with the sync (merged
    weights), 0.21 with the engines left on the base model (B = 0.3 x noise, far from it).
    Here with model.lora.merge=false, so the engines serve base + adapter and a sync is the
    tensors PEFT saved in final/adapter, in the engines' dtype."""
    import json

    from safetensors import safe_open
    from peft import LoraConfig, get_peft_model

    from peer_rl.workers.fsdp import load_pretrained

    torch.manual_seed(0)
    base = load_pretrained(grpo_models["policy"])
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            exclude_modules=r"model\.visual(\..*)?"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    model.save_pretrained(tmp_path / "adapter")
    out = tmp_path / "run"
    _train(out, grpo_models, "model.lora.rank=4", "model.lora.lora_alpha=8",
           "model.lora.target_modules=[q_proj,v_proj]",
           f"model.lora.lora_adapter_path={tmp_path / 'adapter'}",
           "model.lora.merge=false", "trainer.async_training.staleness=1",
           "trainer.total_steps=1", "trainer.save_freq=0")
    (m,) = _metrics(out)
    assert m["async/behavior_abs_log_ratio"] < 0.02
    value = {"float32": 4, "bfloat16": 2}[
        json.loads((out / "memory.json").read_text())["dtype"]["rollout"]]
    with safe_open(str(out / "final" / "adapter" / "adapter_model.safetensors"), "pt") as fh:
        adapter = sum(fh.get_tensor(k).numel() * value for k in fh.keys())
    assert m["sync/bytes"] == adapter
