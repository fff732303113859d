"""`peer-rl plan`: parameter counts against transformers' own models (built on the meta device,
no weight allocated), placements and memory worked out by hand, and every suggested setting
planned again by the CLI itself."""
from __future__ import annotations

from pathlib import Path

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


@pytest.mark.parametrize("recipe", ["peer_rur_dialogue", "rlver"])
def test_the_dialogue_recipes_give_the_seeker_a_gpu_of_its_own_sized_as_an_engine(recipe,
                                                                                 capsys):
    """2 rollout engines, the 2 judges on one GPU, 4 ranks, and the seeker: an engine of its
    model's weights plus its share of the GPU for the KV cache (a 7B model: ~14 GiB of
    weights), not an encoder's 1 GiB."""
    assert main(["plan", f"recipe={recipe}", "model.path=Qwen2.5-VL-7B",
                 "reward_model.path=Qwen2.5-VL-7B", "seeker.path=Qwen2.5-7B", "nodes=1",
                 "gpus_per_node=8", "gpu_memory_gib=80"]) == 0
    out = capsys.readouterr().out
    pools = [ln.split(": ", 1)[1].split(" = ")[0] for ln in out.splitlines()
             if ln.startswith("  node 0 GPU ")]
    assert len(pools) == 8 and sum(p.startswith("rollout") for p in pools) == 2
    assert sum(p.startswith("seeker") for p in pools) == 1
    seeker = next(ln for ln in out.splitlines() if ln.startswith("  seeker "))
    weights = float(seeker.split("weights ")[1].split(" ")[0])
    assert 13 < weights < 16 and "KV cache" in seeker
    assert "turns x 24 prompts x 4 samples" in out


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


def test_qwen3_vl_8b_counts_what_transformers_builds():
    """PEER's policy: text and vision tower each exactly as transformers' Qwen3-VL builds them
    (no attention biases, per-head Q and K norms; an ungated vision MLP, LayerNorms with biases,
    learned position embeddings and three deepstack mergers)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    cfg = NAMED["Qwen3-VL-8B"]
    import torch

    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(
            text_config=cfg["text_config"], vision_config=cfg["vision_config"],
            tie_word_embeddings=False))
    vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in n)
    total = sum(p.numel() for p in model.parameters())
    assert vision_params(cfg) == vision
    assert text_params(cfg) == total - vision


def _supervised_cfg(*overrides):
    from peer_rl.planning import supervised

    return supervised.load(["recipe=sft", "model.path=Qwen3-VL-8B", *overrides])


def test_a_supervised_rank_by_hand():
    """SMALL (404 parameters, no vision tower) on 2 GPU ranks, micro-batch 1 x 16 tokens, no
    recomputation: fp32 master 4 x 404 / 2 = 808, gradients 808, AdamW 2 x 808; no reference;
    two bf16 gathered layers 2 x 2 x 182; the head 5 x 4 bytes x 16 positions x vocabulary 10 =
    3,200; activations 168 bf16 bytes a token and layer (test_a_cpu_policy_rank_by_hand) x 16
    x 2 layers. The Bradley-Terry stage: pairs (2 x 16 tokens), no vocabulary-wide head."""
    from peer_rl.planning import supervised

    cfg = _supervised_cfg("trainer.world_size=2", "trainer.micro_batch_size=1",
                          "trainer.max_length=16", "model.gradient_checkpointing=false")
    est = supervised.rank_estimate(cfg, (SMALL, 404, 0, "SMALL"), 80)
    assert est.parts == {"master weights": 808, "gradients": 808, "AdamW moments": 1616,
                         "reference": 0, "gathered layers": 728, "log-prob head": 3200,
                         "CUDA context": memory.CUDA_CONTEXT, "activations": 168 * 16 * 2}
    bt = supervised.load(["recipe=escrag_rm", "model.path=Qwen2.5-7B", "trainer.world_size=2",
                          "trainer.micro_batch_size=1", "trainer.max_length=16",
                          "model.gradient_checkpointing=false"])
    # config-only shape: the untied output layer (10 x 4) becomes a one-output head (4)
    est = supervised.rank_estimate(bt, (SMALL, 404, 0, "SMALL (config.json)"), 80)
    assert est.parts["master weights"] == 4 * (404 - 40 + 4) // 2
    assert est.parts["log-prob head"] == 0 and est.parts["activations"] == 168 * 32 * 2


def test_the_supervised_sft_of_peers_policy_by_hand():
    """recipes/sft.yaml with Qwen3-VL-8B on its 8 ranks: 8,767,123,696 parameters, of which the
    frozen vision tower's 576,388,336 get no gradient or AdamW state, so 8,190,735,360 train.
    Per rank: fp32 master 4 x 8,767,123,696 / 8 = 4,383,561,848 bytes; gradients
    4 x 8,190,735,360 / 8 = 4,095,367,680; AdamW's two moments 8,190,735,360: 16,669,664,888
    bytes, 15.5 GiB of state a rank."""
    from peer_rl.planning import supervised
    from peer_rl.planning.shapes import model_shape

    est = supervised.rank_estimate(_supervised_cfg(), model_shape("Qwen3-VL-8B"), 80)
    state = [est.parts[k] for k in ("master weights", "gradients", "AdamW moments")]
    assert state == [4_383_561_848, 4_095_367_680, 8_190_735_360]
    assert sum(state) == 16_669_664_888 and est.parts["reference"] == 0
    with_lora = supervised.rank_estimate(_supervised_cfg("model.lora.rank=8"),
                                         model_shape("Qwen3-VL-8B"), 80)
    # LoRA r=8 on all 7 linear layers of 36: 8 x (q 4096+4096, k 4096+1024, v 4096+1024,
    # o 4096+4096, gate and up 4096+12288 each, down 12288+4096) = 8 x 75,776 a layer
    adapters = 36 * 8 * 75_776
    assert with_lora.parts["gradients"] == 4 * adapters // 8
    assert with_lora.parts["master weights"] == 4 * 8_767_123_696 // 8 + 4 * adapters // 8


def _grpo_tokens_args():
    # 3 prompts x 2 samples, prompts of 100 - 30 = 70 tokens, replies of 30; 2 epochs, so the
    # old log-probs are recomputed
    return ["plan", "recipe=peer_rur", "model.path=Qwen2.5-VL-7B",
            "reward_model.path=Qwen2.5-VL-7B", "nodes=2", "data.train_batch_size=3",
            "rollout.n=2", "rollout.max_model_len=100", "rollout.response_length=30",
            "actor.ppo_epochs=2", "actor.ppo_mini_batch_size=3", "actor.ppo_micro_batch_size=2",
            "trainer.total_steps=10"]


def test_a_grpo_steps_tokens_and_time_by_hand(capsys):
    """6 samples of 70 + 30 tokens: rollout 600 processed, 180 generated; update 2 epochs x 600
    = 1,200 trained + (reference + old log-probs) 2 x 600 = 1,200 forward only. At 90 generated
    tok/s and 600 update tok/s: 2 s + 4 s = 6 s a step, 60 s for 10 steps. With shared prefixes
    (actor.shared_prefix, auto: on) a pass is 3 prompts x 70 + 6 replies x 30 = 390: 780
    trained + 780 forward only = 1,560, 2.6 s at 600 tok/s, 4.6 s a step, 46 s for 10."""
    assert main([*_grpo_tokens_args(), "actor.shared_prefix=false",
                 "--throughput", "rollout=90,update=600"]) == 0
    out = capsys.readouterr().out
    assert "  rollout  3 prompts x 2 samples x (70 + 30) = 600 (180 generated)\n" in out
    assert ("  update   6 sequences x 100 x (2 training epochs + the reference's, the old "
            "log-probs' forward) = 2,400 (1,200 trained, 1,200 forward only)\n") in out
    assert "  rollout 180 generated / 90 tok/s = 2.0 s; update 2,400 / 600 tok/s = 4.0 s\n" in out
    assert "  = 6.0 s a step, 1.0 min for trainer.total_steps=10 " in out
    assert "estimated from the throughput given" in out
    assert main([*_grpo_tokens_args(), "--throughput", "rollout=90,update=600"]) == 0
    out = capsys.readouterr().out
    assert ("  update   (3 prompts x 70 + 6 replies x 30: actor.shared_prefix) x (2 training "
            "epochs + the reference's, the old log-probs' forward) = 1,560 (780 trained, 780 "
            "forward only)\n") in out
    assert "  rollout 180 generated / 90 tok/s = 2.0 s; update 1,560 / 600 tok/s = 2.6 s\n" in out
    assert "  = 4.6 s a step, 46.0 s for trainer.total_steps=10 " in out


def test_the_tokens_of_an_on_policy_and_an_escrag_step_by_hand():
    """One epoch on one mini-batch: no old log-probs' pass. ESCRAG-R1 with retrieval: a second
    (refined) rollout pass; train_initial also trains the initial replies."""
    from peer_rl.config.schema import load_config
    from peer_rl.planning.tokens import step_tokens

    t = step_tokens(load_config(["recipe=peer_rur", "data.train_batch_size=3", "rollout.n=2",
                                 "actor.ppo_mini_batch_size=3", "actor.ppo_micro_batch_size=2"]),
                    prompt_length=50)
    # actor.shared_prefix (auto: on, packed text rows): each pass runs 3 prompts once and the
    # 6 replies after them; the reference's pass and the training pass
    assert (t.prompt, t.rollout, t.update) == (50, 6 * (50 + t.response),
                                               2 * (3 * 50 + 6 * t.response))
    off = step_tokens(load_config(["recipe=peer_rur", "data.train_batch_size=3", "rollout.n=2",
                                   "actor.ppo_mini_batch_size=3", "actor.ppo_micro_batch_size=2",
                                   "actor.shared_prefix=false"]),
                      prompt_length=50)
    assert off.update == 2 * 6 * (50 + t.response)
    e = step_tokens(load_config(["recipe=escrag_r1_tiny", "data.train_batch_size=3",
                                 "rollout.n=2", "rollout.response_length=10",
                                 "actor.ppo_mini_batch_size=6", "actor.ppo_micro_batch_size=2",
                                 "retrieval.train_initial=true"]), prompt_length=20)
    # 2 passes x 6 samples x 30; 12 trained sequences (refined and initial) x 30, one epoch on
    # one mini-batch of 6 x 2 = 12: on-policy, reference only
    assert (e.rollout, e.generated, e.update) == (360, 120, 2 * 12 * 30)


@pytest.mark.parametrize("flag, message", [
    ("rollout=90", "expected --throughput rollout=TOK/S,update=TOK/S"),
    ("rollout=90,update=0", "'update=0': expected --throughput"),
    ("rollout=fast,update=1", "'rollout=fast': expected"),
])
def test_a_bad_throughput_is_one_line(capsys, flag, message):
    assert main(["plan", "recipe=tiny", "--throughput", flag]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


RECIPES = Path(__file__).resolve().parents[2] / "recipes"
# the recipes whose models are a placeholder or an earlier stage's output: a shape to plan with
SHAPES = {name: [f"model.path={shape}"] for name, shape in {
    "sft": "Qwen3-VL-8B", "unifireward": "Qwen3-VL-8B", "prm": "Qwen3-VL-8B",
    "orm": "Qwen3-VL-8B", "escrag_rm": "Qwen2.5-7B", "escrag_sft": "Qwen2.5-7B",
    "sft_smollm2": "SmolLM2-135M", "unifireward_smollm2": "SmolLM2-135M"}.items()}
SHAPES |= {name: ["model.path=SmolLM2-135M", "reward_model.path=SmolLM2-135M"]
           for name in ("peer_smollm2", "peer_rur_smollm2")}
SHAPES["dialogue_smollm2"] = SHAPES["peer_smollm2"] + ["seeker.path=SmolLM2-135M"]
SETTINGS = {"data": "recipe=data: the settings of `peer-rl data filter|personas|rewrite|"
                    "preference|cold-start`",
            "eval": "recipe=eval: the settings of `peer-rl eval esc|sage|safety|diversity`"}


def test_plan_accepts_every_shipped_recipe(capsys):
    """Each recipes/*.yaml is planned (its memory and a step's tokens printed, fitting or
    refused) or, for a command's settings, named in one line as what it is for."""
    names = sorted(p.stem for p in RECIPES.glob("*.yaml"))
    assert set(SHAPES) | set(SETTINGS) <= set(names)
    for name in names:
        rc = main(["plan", f"recipe={name}", "nodes=2", *SHAPES.get(name, [])])  # no fix search
        out = capsys.readouterr().out
        if name in SETTINGS:
            assert rc == 0 and out.startswith(SETTINGS[name]), (name, out)
            assert "not a training run: nothing to place or size" in out
            assert len(out.strip().splitlines()) == 1
            continue
        assert rc in (0, 2), name
        assert "placed on" in out and "tokens per step" in out, (name, out)
        # a GRPO plan sizes its GPU workers; a supervised stage's ranks on CPUs too
        pools = out.split("placed on\n")[1].split("\n\n")[0]
        if " GPU " in pools or "supervised stage" in out:
            assert "GiB:\n" in out, (name, out)
        assert out.rstrip().endswith("fits.") if rc == 0 else "refused:" in out, name


def test_a_supervised_recipe_without_its_model_names_the_shapes(capsys):
    assert main(["plan", "recipe=unifireward"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: model.path: recipe 'unifireward' needs a starting model")
    assert "Qwen3-VL-8B" in err and len(err.splitlines()) == 1


def test_a_supervised_stage_that_does_not_fit_is_refused_with_settings_that_fit(capsys):
    """sft at 16,384 tokens a micro-batch on 48 GiB GPUs: the full-vocabulary logits alone are
    46 GiB; one row a micro-batch halves them and fits (planned again)."""
    args = ["plan", "recipe=sft", "model.path=Qwen3-VL-8B", "gpu_memory_gib=48"]
    assert main(args) == 2
    out = capsys.readouterr().out
    assert "node 0 GPU 0: train " in out.split("refused:")[1]
    fixes = out.split("settings with which it fits (each planned again):\n")[1].splitlines()
    assert fixes[0] == "  trainer.micro_batch_size=1"
    for fix in fixes:
        assert main(args + fix.split()) == 0, fix
        capsys.readouterr()


def _docs_plan_blocks():
    """(page, command, shown lines, whole) of every `$ peer-rl plan` block on the docs pages:
    an indented block whose first line is the command (continued with backslashes); `...`
    after it means the lines shown are the output's last ones."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    found = []
    for page in sorted(docs.glob("*.md")):
        lines = page.read_text(encoding="utf-8").split("\n")
        for k, line in enumerate(lines):
            if not line.startswith("    $ peer-rl plan "):
                continue
            block = []
            for ln in lines[k:]:
                if not ln.startswith("    "):
                    break
                block.append(ln[4:])
            command = ""
            while True:
                part = block.pop(0)
                command += " " + part.rstrip("\\").strip()
                if not part.endswith("\\"):
                    break
            whole = not (block and block[0] == "...")
            found.append((page.name, command.split()[3:], block if whole else block[1:], whole))
    return found


def test_the_docs_plan_examples_print_what_they_show(capsys):
    """Every `peer-rl plan` example on the docs pages, run: the output is the block as shown
    (its last lines where the block elides the start)."""
    blocks = _docs_plan_blocks()
    assert any("--throughput" in b[1] for b in blocks) and any("recipe=sft" in b[1] for b in blocks)
    for page, argv, shown, whole in blocks:
        main(["plan", *argv])
        out = capsys.readouterr().out.rstrip("\n").split("\n")
        assert (out if whole else out[-len(shown):]) == shown, (page, argv)
