"""actor.gradient_checkpointing=auto: the activation estimate worked out by hand, and the
choice it leads to."""
from __future__ import annotations

from peer_rl.compute.activation_memory import (GiB, Trained, adapted_linears, choose_recomputation,
                                       fitted_token_budget, layer_activation_bytes,
                                       logprob_head_bytes, recomputed_activation_bytes,
                                       stored_activation_bytes, training_state_bytes)

# the bench's "~100M" policy (peer_rl.bench.models) and the shipped tiny policy's text config
M100 = {"hidden_size": 768, "intermediate_size": 2560, "num_attention_heads": 12,
        "num_hidden_layers": 12}
TINY_VL = {"vision_config": {"hidden_size": 64},
           "text_config": {"hidden_size": 128, "intermediate_size": 256,
                           "num_attention_heads": 2, "num_hidden_layers": 2}}


def test_the_estimate_by_hand():
    # ~100M policy, float32, full weights; per token and layer, in values: Q, K, V, the
    # attention output 4 x 768, the MLP's gate, up and activation 3 x 2,560, the inputs of the
    # training q/k/v, o, gate/up (3 x 768) and down (2,560), both norms' outputs 2 x 768:
    # 1,536 + 1,536 + 7,680 + 2,304 + 2,560 + 1,536 = 17,152 values x 4 bytes = 68,608; both
    # norms' float32 inputs 2 x 4 x 768 = 6,144; a log-sum-exp per head 4 x 12 = 48: 74,800
    assert layer_activation_bytes(M100, Trained(4)) == 74_800
    assert stored_activation_bytes(M100, 4096, Trained(4)) == 74_800 * 4096 * 12
    # with recomputation: each layer's input (768 x 4 bytes) kept, one layer live again
    assert recomputed_activation_bytes(M100, 4096, Trained(4)) == (768 * 4 * 12 + 74_800) * 4096
    # bfloat16, LoRA r=8 on q and v only: the frozen o, gate/up, down keep no input, the norms
    # no output; 3,072 + 7,680 + 768 (q/k/v's input) + 2 x 8 = 11,536 values x 2 = 23,072,
    # + 6,144 + 48 = 29,264
    assert layer_activation_bytes(M100, Trained(2, 8, ("q_proj", "v_proj"))) == 29_264
    # LoRA on every linear layer: 11,536 - 16 + 768 + 768 + 2,560 + 7 x 8 = 15,672 values
    assert layer_activation_bytes(M100, Trained(2, 8, adapted_linears(["all-linear"]))) == (
        15_672 * 2 + 6_144 + 48)
    # a vision-language config is read from its text_config (h 128, MLP 256, 2 heads): bf16,
    # full weights: 256 + 256 + 768 + 384 + 256 + 256 = 2,176 values x 2 + 1,024 + 8 = 5,384
    assert stored_activation_bytes(TINY_VL, 4096, Trained(2)) == 5_384 * 4096 * 2
    assert training_state_bytes(1000) == 12000


def test_the_log_prob_heads_peak_by_hand():
    # 5 x float32 logits of a 1,024-position chunk over a 49,152-token vocabulary: 0.94 GiB
    assert logprob_head_bytes({"vocab_size": 49_152}, 1024) == 5 * 4 * 1024 * 49_152


def test_auto_recomputes_only_where_the_activations_do_not_fit_a_ranks_share():
    # 2 ranks on a node with 12 GiB free: each may plan on 0.5 x 6 = 3 GiB < 4.5 + 0.6
    on, line = choose_recomputation("auto", int(4.5 * GiB), int(0.6 * GiB), 12 * GiB, 2)
    assert on and "recomputation on (auto" in line and "3.0 GiB (50% of 12.0 GiB free / 2" in line
    on, line = choose_recomputation("auto", int(0.2 * GiB), int(0.1 * GiB), 12 * GiB, 2)
    assert not on and "recomputation off (auto" in line
    # the same need with the node to one rank fits (0.5 x 12 = 6 GiB)
    assert not choose_recomputation("auto", int(4.5 * GiB), int(0.6 * GiB), 12 * GiB, 1)[0]


def test_a_set_value_is_kept_and_the_estimate_still_said():
    on, line = choose_recomputation("true", 1, 1, 12 * GiB, 2)
    assert on and "actor.gradient_checkpointing=true" in line and "estimate" in line
    on, _ = choose_recomputation("false", 100 * GiB, 0, 12 * GiB, 2)
    assert not on


def test_the_budget_fitted_to_an_activation_cap_by_hand():
    # ~100M policy, float32, full weights: 74,800 bytes x 12 layers = 897,600 bytes a token.
    #   1.25 GiB = 1,342,177,280 bytes: 1,408 tokens keep 1,263,820,800; 1,536 keep 1,378,713,600
    #   1.5 GiB = 1,610,612,736 bytes: 1,792 tokens keep 1,608,499,200; 1,920 keep 1,723,392,000
    fp32 = Trained(4)
    assert fitted_token_budget(M100, 4096, 1.25 * GiB, fp32) == 1408
    assert fitted_token_budget(M100, 4096, 1.5 * GiB, fp32) == 1792
    assert fitted_token_budget(M100, 4096, 1_608_499_200, fp32) == 1792     # exactly at the cap
    assert fitted_token_budget(M100, 4096, 1_608_499_199, fp32) == 1664
    # a budget that fits is kept as set, not rounded; 0 (the cap off, or count micro-batches)
    assert fitted_token_budget(M100, 1000, 1.25 * GiB, fp32) == 1000
    assert fitted_token_budget(M100, 4096, 0, fp32) == 4096
    assert fitted_token_budget(M100, 0, 1.25 * GiB, fp32) == 0
    # the tiny policy keeps 4,096: 5,384 x 2 layers x 4,096 tokens = 0.04 GiB in bfloat16
    assert fitted_token_budget(TINY_VL, 4096, 1.25 * GiB, Trained(2)) == 4096
    # nothing fits: the smallest step (a row longer than the budget still runs, alone)
    assert fitted_token_budget(M100, 4096, 1024, fp32) == 128
    # ... and never above the budget as set: 100 tokens over the cap stay 100, not 128
    assert fitted_token_budget(M100, 100, 1024, fp32) == 100


def test_what_trains_follows_model_lora():
    from types import SimpleNamespace as NS

    from peer_rl.compute.activation_memory import trained_for

    assert trained_for(4) == trained_for(4, NS(rank=0, target_modules=["q_proj"])) == Trained(4)
    assert trained_for(2, NS(rank=8, target_modules=["v_proj", "q_proj"])) == Trained(
        2, 8, ("q_proj", "v_proj"))
    assert trained_for(2, NS(rank=8, target_modules=["all-linear"])).adapted == (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
