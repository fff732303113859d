"""actor.gradient_checkpointing=auto: the activation estimate worked out by hand, and the
choice it leads to."""
from __future__ import annotations

from peer_rl.activation_memory import (GiB, choose_recomputation, fitted_token_budget,
                                       stored_activation_bytes, training_state_bytes)

# the bench's "~100M" policy (peer_rl.bench.models) and the shipped tiny policy's text config
M100 = {"hidden_size": 768, "intermediate_size": 2560, "num_attention_heads": 12,
        "num_hidden_layers": 12}
TINY_VL = {"vision_config": {"hidden_size": 64},
           "text_config": {"hidden_size": 128, "intermediate_size": 256,
                           "num_attention_heads": 2, "num_hidden_layers": 2}}


def test_the_estimate_by_hand():
    # per token and layer: 8 x 768 + 3 x 2560 + 12 heads x 700 positions = 22,224 floats;
    # x 4 bytes x 4,096 tokens x 12 layers = 4,369,416,192 bytes (~4.1 GiB; measured at this
    # shape: ~9 GB a rank without recomputation against ~5 GB with it)
    assert stored_activation_bytes(M100, 4096, 700, 4) == 22224 * 4 * 4096 * 12
    # a vision-language config is read from its text_config; 16-bit halves it
    assert stored_activation_bytes(TINY_VL, 4096, 2048, 2) == (1024 + 768 + 4096) * 2 * 4096 * 2
    assert training_state_bytes(1000) == 12000


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
    # ~100M policy, rows up to 2,048: at t tokens (t <= 2,048 also the row length) a forward
    # keeps (6,144 + 7,680 + 12 t) x 4 bytes x 12 layers x t.
    #   1,024: 26,112 x 48 x 1,024 = 1,283,457,024 bytes (1.195 GiB)
    #   1,152: 27,648 x 48 x 1,152 = 1,528,823,808 bytes (1.424 GiB)
    #   1,280: 29,184 x 48 x 1,280 = 1,793,064,960 bytes (1.670 GiB)
    assert fitted_token_budget(M100, 4096, 2048, 1.25 * GiB) == 1024
    assert fitted_token_budget(M100, 4096, 2048, 1.5 * GiB) == 1152
    assert fitted_token_budget(M100, 4096, 2048, 1_528_823_808) == 1152     # exactly at the cap
    assert fitted_token_budget(M100, 4096, 2048, 1_528_823_807) == 1024
    # a budget that fits is kept as set, not rounded; 0 (the cap off, or count micro-batches)
    assert fitted_token_budget(M100, 1000, 2048, 1.25 * GiB) == 1000
    assert fitted_token_budget(M100, 4096, 2048, 0) == 4096
    assert fitted_token_budget(M100, 0, 2048, 1.25 * GiB) == 0
    # the tiny policy keeps 4,096: (1,024 + 768 + 2 x 2,048) x 4 x 4,096 x 2 = 0.18 GiB
    assert fitted_token_budget(TINY_VL, 4096, 2048, 1.25 * GiB) == 4096
    # nothing fits: the smallest step (a row longer than the budget still runs, alone)
    assert fitted_token_budget(M100, 4096, 2048, 1024) == 128
    # ... and never above the budget as set: 100 tokens over the cap stay 100, not 128
    assert fitted_token_budget(M100, 100, 2048, 1024) == 100
