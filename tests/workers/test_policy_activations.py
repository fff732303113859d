"""peer_rl.compute.activation_memory's per-layer count against what autograd really saves for backward
in the policy worker's own training forward (packed rows, SDPA, FSDP2 mixed precision, PEFT
adapters): the saved tensors are collected with torch's saved-tensor hooks, parameters left
out, and one decoder layer's share is the difference between a 3-layer and a 2-layer model."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from peer_rl.compute.activation_memory import Trained, adapted_linears, layer_activation_bytes
from spawn_util import start_ranks
from test_policy import free_port

pytestmark = pytest.mark.e2e   # the worker runs in a process of its own (spawn_util)

# widths chosen apart (h 64, MLP 96, 4 heads of 16, K/V 2 heads) so a wrong coefficient shows
DIMS = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=256, tie_word_embeddings=True)
ROWS, ROW_LEN = 4, 96
CASES = {  # name: (dtype, lora rank, lora targets)
    "bf16, LoRA r=4 on every linear layer": ("bfloat16", 4, ["all-linear"]),
    "bf16, LoRA r=4 on q and v": ("bfloat16", 4, ["q_proj", "v_proj"]),
    "fp32, full weights": ("float32", 0, ["all-linear"]),
    "bf16, full weights": ("bfloat16", 0, ["all-linear"]),
}


def _saved_bytes(port: int, path: str, dtype: str, rank: int, targets: list[str]) -> int:
    from peer_rl.config.worker_settings import LoRASettings, PolicySettings
    from peer_rl.workers.policy import PolicyWorker

    w = PolicyWorker(0, 1, "127.0.0.1", port, path, PolicySettings(dtype=dtype),
                     lora_settings=LoRASettings(rank=rank, target_modules=targets))
    params = {p.untyped_storage()._cdata for p in w.model.parameters()}
    seen: dict[int, int] = {}

    def keep(t):
        # the parameters FSDP2 gathers for a layer are the module's own while it runs
        live = params | {p.untyped_storage()._cdata for p in w.model.parameters()}
        if t.untyped_storage()._cdata not in live:
            seen[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        return t

    torch.manual_seed(0)
    ids = torch.randint(1, DIMS["vocab_size"], (ROWS, ROW_LEN))
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        w._token_logp(w.model, ids, torch.ones_like(ids), 1.0, entropy=True)
    w.shutdown()
    return sum(seen.values())


def _entry(_, ports, paths, out):
    result = {}
    for i, (name, (dtype, rank, targets)) in enumerate(CASES.items()):
        result[name] = [_saved_bytes(ports[2 * i + j], p, dtype, rank, targets)
                        for j, p in enumerate(paths)]
    with open(out, "w") as f:
        json.dump(result, f)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, list[int]]:
    paths = []
    for layers in (2, 3):
        d = tmp_path_factory.mktemp(f"qwen2_{layers}_layers")
        torch.manual_seed(0)
        Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=layers, **DIMS)).save_pretrained(d)
        paths.append(str(d))
    out = tmp_path_factory.mktemp("saved") / "saved.json"
    ports = [free_port() for _ in range(2 * len(CASES))]
    start_ranks(_entry, (ports, paths, str(out)), nprocs=1)
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", list(CASES))
def test_a_layers_activations_are_what_autograd_saves(saved, case):
    dtype, rank, targets = CASES[case]
    two, three = saved[case]
    per_layer = three - two
    trained = Trained({"bfloat16": 2, "float32": 4}[dtype], rank, adapted_linears(targets))
    estimate = layer_activation_bytes({"num_hidden_layers": 3, **DIMS}, trained) * ROWS * ROW_LEN
    assert estimate == pytest.approx(per_layer, rel=0.05), (case, estimate, per_layer)
