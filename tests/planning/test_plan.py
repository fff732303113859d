"""`peer-rl plan`: parameter counts against transformers' own models (built on the meta device,
no weight allocated), placements and memory worked out by hand, and every suggested setting
planned again by the CLI itself."""
from __future__ import annotations

import pytest

from peer_rl.compute.activation_memory import GiB
from peer_rl.cli import main
from peer_rl.planning import memory
from peer_rl.planning.cluster import Node, from_overrides
from peer_rl.planning.placement import Placement
from peer_rl.planning.shapes import NAMED, text_params, vision_params

SMALL = {"hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10,
         "tie_word_embeddings": False, "max_position_embeddings": 64}


def _meta_count(cls, config) -> int:
    import torch

    with torch.device("meta"):
        model = cls(config)
    return sum(p.numel() for p in model.parameters())


def test_text_params_by_hand():
    # per layer: q 4x4 + k 4x2 + v 4x2 + o 4x4 = 48, biases 4 + 2 + 2 = 8, MLP 3 x 4 x 8 = 96,
    # two norms 8 -> 160; two layers 320; embeddings and output 2 x 40; final norm 4
    assert text_params(SMALL) == 404
    assert text_params({**SMALL, "tie_word_embeddings": True}) == 364


@pytest.mark.parametrize("name", ["Qwen2.5-7B", "SmolLM2-135M"])
def test_named_text_shapes_count_what_transformers_builds(name):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg = NAMED[name]
    if name.startswith("Qwen"):
        want = _meta_count(Qwen2ForCausalLM, Qwen2Config(**cfg))
    else:      # SmolLM2 is a Llama without attention biases: the biases are the difference
        want = _meta_count(LlamaForCausalLM, LlamaConfig(**cfg))
        t = cfg
        hd = t["hidden_size"] // t["num_attention_heads"]
        want += t["num_hidden_layers"] * (t["num_attention_heads"] + 2 * t["num_key_value_heads"]) * hd
    assert text_params(cfg) == want


def test_the_vision_language_shape_is_within_a_percent_of_transformers():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    cfg = NAMED["Qwen2.5-VL-7B"]
    want = _meta_count(Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLConfig(
        text_config=cfg["text_config"], vision_config=cfg["vision_config"]))
    got = text_params(cfg) + vision_params(cfg)
    assert abs(got - want) / want < 0.01


def test_spread_and_pack_by_hand():
    nodes = [Node(cpus=16, gpus=4, gpu_memory_gib=80)] * 2
    p = Placement(nodes)
    assert p.place("rollout", {"CPU": 1, "GPU": 1}, 3, "SPREAD") is None
    assert [(s.node, list(s.gpus)) for s in p.slots] == [(0, [0]), (1, [0]), (0, [1])]
    # 2 GPUs left on node 0, 3 on node 1: node 1 scores higher (14/15 + 2/3 against 13/14 +
    # 1/2), takes the 3 it holds, and node 0 the fourth
    assert p.place("actor", {"CPU": 1, "GPU": 1}, 4, "PACK") is None
    assert [(s.node, list(s.gpus)) for s in p.slots[3:]] == [(1, [1]), (1, [2]), (1, [3]),
                                                             (0, [2])]
    # two half-GPU judges share node 0's last GPU; a third does not fit, and nothing is kept
    assert p.place("reward_model", {"CPU": 1, "GPU": 0.5}, 2, "PACK") is None
    assert [(s.node, s.gpus) for s in p.slots[7:]] == [(0, {3: 0.5}), (0, {3: 0.5})]
    left = p.place("extra", {"CPU": 1, "GPU": 1}, 1, "PACK")
    assert left is not None and left.free_gpus == 0 and len(p.slots) == 9


def test_nodes_are_chosen_by_rays_least_resource_score():
    """Worked by hand from Ray's scorer: score = sum over the bundle's resources of
    (available - requested) / available, highest first."""
    # PACK, 3 x {1 CPU, 1 GPU}: node 0 (8 CPU, 2 GPU) scores 7/8 + 1/2 = 1.375, node 1 (2 CPU,
    # 4 GPU) 1/2 + 3/4 = 1.25: node 0 takes the two it holds, node 1 the third (choosing the
    # node with more free GPUs first would put two on node 1)
    p = Placement([Node(cpus=8, gpus=2, gpu_memory_gib=80), Node(cpus=2, gpus=4,
                                                                 gpu_memory_gib=80)])
    assert p.place("actor", {"CPU": 1, "GPU": 1}, 3, "PACK") is None
    assert [(s.node, list(s.gpus)) for s in p.slots] == [(0, [0]), (0, [1]), (1, [0])]
    # SPREAD after a pack on node 0: node 0 scores 13/14 + 1/2, nodes 1 and 2 15/16 + 3/4, so
    # the engines go to nodes 1 and 2 (the node holding fewest of the group first would pick 0)
    p = Placement([Node(cpus=16, gpus=4, gpu_memory_gib=80)] * 3)
    assert p.place("actor", {"CPU": 1, "GPU": 1}, 2, "PACK") is None
    assert p.place("rollout", {"CPU": 1, "GPU": 1}, 2, "SPREAD") is None
    assert [s.node for s in p.slots] == [0, 0, 1, 2]


def test_a_group_that_does_not_fit_places_nothing():
    p = Placement([Node(cpus=4, gpus=2, gpu_memory_gib=80)])
    assert p.place("actor", {"CPU": 1, "GPU": 1}, 3, "PACK").count == 3
    assert p.slots == [] and p.cpus == [4] and p.gpu_free == [[1.0, 1.0]]


def test_an_engine_estimate_by_hand():
    # kv per token in bf16: 2 (K, V) x 2 layers x 1 kv head x 2 head dim x 2 bytes = 16 bytes
    e = memory.engine("rollout", SMALL, 404, max_model_len=64, utilization=0.5, gpu_gib=8)
    claimed = 4 * GiB
    kv = claimed - 2 * 404 - memory.ENGINE_WORKSPACE
    assert e.parts == {"weights": 808, "activations": memory.ENGINE_WORKSPACE, "KV cache": kv,
                       "CUDA context": memory.CUDA_CONTEXT}
    assert e.detail.startswith(f"KV cache for {kv // 16:,} tokens") and not e.problem
    tight = memory.engine("rollout", SMALL, 404, max_model_len=64, utilization=0.19,
                          gpu_gib=8)     # 1.52 GiB claimed: 1.5 of activations, ~20 MiB of KV
    assert not tight.problem
    short = memory.engine("rollout", SMALL, 404, 64, utilization=0.18, gpu_gib=8)
    assert "less than one rollout.max_model_len=64 sequence" in short.problem


def test_a_cpu_policy_rank_by_hand():
    """SMALL (404 parameters) on 2 CPU ranks, no LoRA: fp32 everything, no CUDA context; the
    GPU rank of the same settings gathers its layers in bf16 and has a context. A gathered
    "layer" is a layer's share of the weights past the input embeddings, (404 - 40) / 2 = 182
    (the output layer and final norm spread over the layers: an upper bound on the 160 of a
    decoder layer). The log-prob head: 5 x float32 x chunk 8 x vocabulary 10 = 1,600.
    Activations, per token and layer (h 4, MLP 8, 2 heads, K/V width 1 x 2): in the compute
    dtype 5 x 4 + 2 x 2 + 4 x 8 = 56 values, plus both norms' outputs (full weights: 2 x 4);
    in float32 both norms' inputs (2 x 4) and a log-sum-exp per head (2). fp32: 56 x 4 + 8 x 4
    + 8 x 4 + 2 x 4 = 296 bytes; bf16: 56 x 2 + 8 x 2 + 8 x 4 + 2 x 4 = 168; x 32 tokens x 2
    layers."""
    from types import SimpleNamespace as NS

    actor = NS(world_size=2, freeze_vision_tower=True, ppo_max_token_len_per_gpu=32,
               micro_batch_activation_gib=0, logits_chunk_size=8, ref_param_offload=False,
               gradient_checkpointing="false")
    lora = NS(rank=0, target_modules=["all-linear"])
    cpu = memory.policy_rank(SMALL, 404, 0, actor, lora, 64, device=memory.CPU)
    assert cpu.parts == {
        "master weights": 4 * 404 // 2, "gradients": 808, "AdamW moments": 1616,
        "reference": 808, "gathered layers": 2 * 4 * 182, "log-prob head": 1600,
        "activations": 296 * 32 * 2}
    gpu = memory.policy_rank(SMALL, 404, 0, actor, lora, 64)
    assert gpu.parts["gathered layers"] == 2 * 2 * 182
    assert gpu.parts["CUDA context"] == memory.CUDA_CONTEXT
    assert gpu.parts["activations"] == 168 * 32 * 2
    assert memory.cpu_engine("rollout", 404, 0.5).parts == {"weights": 1616,
                                                            "KV cache": GiB // 2}


def test_lora_params_by_hand():
    # rank 2: q 2x(4+4) + k 2x(4+2) + v 2x(4+2) + o 2x(4+4) + gate, up 2x(4+8) each + down
    # 2x(8+4) = 16 + 12 + 12 + 16 + 24 + 24 + 24 = 128 a layer, 2 layers
    assert memory.lora_params(SMALL, 2, ["all-linear"]) == 256
    assert memory.lora_params(SMALL, 2, ["q_proj", "v_proj"]) == 2 * (16 + 12)


def test_cluster_overrides_refuse_unknown_keys():
    assert from_overrides({"nodes": "2", "gpus_per_node": "4"}) == [Node(64.0, 4, 80.0)] * 2
    with pytest.raises(ValueError, match="unknown key"):
        from_overrides({"gpu_per_node": "4"})


@pytest.mark.parametrize("args, message", [
    (["--probe"], "--probe places the run on a running cluster: give --from-ray ADDRESS"),
    (["--from-ray", "auto", "--probe", "--probe-timeout", "0"],
     "--probe-timeout=0: expected seconds > 0"),
])
def test_probe_flags_are_checked_before_any_cluster_is_reached(capsys, args, message):
    assert main(["plan", *args]) == 2
    assert message in capsys.readouterr().err


def test_peer_rur_on_one_8_gpu_node_is_refused_and_each_suggestion_fits(capsys):
    args = ["plan", "recipe=peer_rur", "model.path=Qwen2.5-VL-7B",
            "reward_model.path=Qwen2.5-VL-7B", "nodes=1", "gpus_per_node=8", "gpu_memory_gib=80"]
    assert main(args) == 2
    out = capsys.readouterr().out
    assert "resources.actor: 8 x {'CPU': 4.0, 'GPU': 1.0} cannot be placed (2 GPU(s)" in out
    fixes = out.split("settings with which it fits (each planned again):\n")[1].splitlines()
    assert fixes and all(f.startswith("  ") for f in fixes)
    for fix in fixes:
        assert main(args + fix.split()) == 0, fix
        assert "fits." in capsys.readouterr().out


def test_peer_rur_on_two_nodes_fits_and_names_each_gpu(capsys):
    assert main(["plan", "recipe=peer_rur", "model.path=Qwen2.5-VL-7B",
                 "reward_model.path=Qwen2.5-VL-7B", "nodes=2", "gpus_per_node=8"]) == 0
    out = capsys.readouterr().out
    gpus = [ln for ln in out.splitlines() if ln.startswith("  node ")]
    assert len(gpus) == 14            # 4 engines + 2 judges + 8 ranks, one GPU each
    assert "policy ranks span 2 nodes" in out


def test_a_policy_that_does_not_fit_its_gpu_is_refused_naming_the_shortfall(capsys):
    # 7B on 4 ranks of 24 GiB GPUs: the fp32 state alone is 8.3 B x 16 bytes / 4 = 31 GiB
    args = ["plan", "recipe=peer", "model.path=Qwen2.5-VL-7B", "reward_model.path=Qwen2.5-VL-3B",
            "rollout.num_workers=2", "reward_model.num_workers=1", "actor.world_size=4",
            "rollout.gpu_memory_utilization=0.9", "reward_model.gpu_memory_utilization=0.9",
            "reward_model.max_model_len=4096", "nodes=1", "gpus_per_node=8", "gpu_memory_gib=24"]
    assert main(args) == 2
    out = capsys.readouterr().out
    assert "GiB short)" in out and "actor" in out.split("refused:")[1]


@pytest.mark.parametrize("recipe, shape", [("peer_rur_8gpu", "Qwen2.5-VL-7B"),
                                           ("escrag_r1_8gpu", "Qwen2.5-7B")])
def test_the_8_gpu_recipes_fill_one_node_of_8(recipe, shape, capsys):
    """peer_rur_8gpu: 3 engines + 2 judges on one GPU + 4 ranks; escrag_r1_8gpu: 3 engines +
    1 reward model + 4 ranks. Eight GPUs each, none idle, none over 80 GiB."""
    assert main(["plan", f"recipe={recipe}", f"model.path={shape}", f"reward_model.path={shape}",
                 "nodes=1", "gpus_per_node=8", "gpu_memory_gib=80"]) == 0
    out = capsys.readouterr().out
    gpus = [ln for ln in out.splitlines() if ln.startswith("  node 0 GPU ")]
    assert len(gpus) == 8
    pools = [ln.split(": ", 1)[1].split(" = ")[0] for ln in gpus]
    assert sum(p.startswith("rollout") for p in pools) == 3
    assert sum(p.startswith("actor") for p in pools) == 4
    shared = [p for p in pools if p.count("reward_model") == 2]
    assert len(shared) == (1 if recipe == "peer_rur_8gpu" else 0)


def test_the_sizing_table_refuses_fits_and_scales_as_plan_does(capsys):
    shape = ["model.path=Qwen2.5-VL-7B", "reward_model.path=Qwen2.5-VL-7B"]
    assert main(["plan", "recipe=peer_rur", *shape, "--table"]) == 0
    rows = {ln.split(" | ")[0].strip("| "): ln.split(" | ")[1:]
            for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")}
    assert set(rows) == {"nodes x GPUs", "---", "1 x 8", "2 x 8", "4 x 8"}
    # 14 GPUs asked: refused on 8 (with a fix), fits on 16 and on 32, 80 and 141 GiB alike
    assert all(c.startswith("refused (resources.actor); fits with `") for c in rows["1 x 8"])
    assert all(c.startswith("fits: 14 of 16 GPUs") for c in rows["2 x 8"])
    assert all(c.startswith("fits: 14 of 32 GPUs") for c in rows["4 x 8"])
    # the scale-up it offers for 4 x 8 is one plan accepts, on 28 of the 32 GPUs
    cell = rows["4 x 8"][0]
    assert "; x2 fits (`" in cell
    more = cell.split("`")[1].split()
    assert more == ["rollout.num_workers=8", "reward_model.num_workers=4", "actor.world_size=16"]
    assert main(["plan", "recipe=peer_rur", *shape, *more, "nodes=4", "gpus_per_node=8"]) == 0
    out = capsys.readouterr().out
    assert len([ln for ln in out.splitlines() if ln.startswith("  node ")]) == 28


def test_the_8gpu_recipes_comment_quotes_what_plan_says(capsys):
    """recipes/peer_rur_8gpu.yaml gives a rank's memory and the command that shows it."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "recipes" / "peer_rur_8gpu.yaml").read_text()
    quoted = re.search(r"FSDP2: ([\d.]+) GiB a rank", text).group(1)
    command = re.search(r"#   peer-rl (plan .*?)\n", text.replace("\\\n#      ", "")).group(1)
    assert main(command.split()) == 0
    actor = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  actor "))
    assert actor.endswith(f"= {quoted}"), actor
