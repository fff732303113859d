"""Whether the policy ranks recompute decoder activations in backward
(`actor.gradient_checkpointing: auto`): the activations one training forward at the token budget
would keep, estimated from the model's config, against the memory a rank may still use.

Recomputation costs about a third more update compute, so it is worth it only where the
activations would not fit: off for the tiny recipe's policy (~0.2 GB a rank), on for a ~100M
policy at a 4,096-token budget beside two engines on a 24 GB machine (measured ~9 GB a rank
without it, ~5 GB with).
"""
from __future__ import annotations

from peer_rl.kv_cache import text_config

GiB = 2**30
SETTINGS = ("auto", "true", "false")


def stored_activation_bytes(config: dict, tokens: int, row_len: int, dtype_bytes: int = 4) -> int:
    """What a training forward of `tokens` tokens (rows of up to `row_len`) keeps for backward
    without recomputation, over all decoder layers: per token and layer ~8 hidden-size vectors
    (norm inputs and outputs, Q, K, V, attention output, the residual adds), 3 MLP-width ones
    (gate, up, their product) and one attention probability per head and key position. An upper
    bound where K/V are grouped or the attention kernel keeps no probabilities."""
    text = text_config(config)
    h, i = text["hidden_size"], text["intermediate_size"]
    per_token_layer = 8 * h + 3 * i + text["num_attention_heads"] * row_len
    return per_token_layer * dtype_bytes * tokens * text["num_hidden_layers"]


def recomputed_activation_bytes(config: dict, tokens: int, row_len: int,
                                dtype_bytes: int = 4) -> int:
    """The same forward with each decoder layer recomputed in backward: every layer keeps only
    its input (one hidden-size vector per token), and one layer's activations are live again
    while its backward runs."""
    text = text_config(config)
    layers = text["num_hidden_layers"]
    inputs = text["hidden_size"] * dtype_bytes * tokens * layers
    return inputs + stored_activation_bytes(config, tokens, row_len, dtype_bytes) // layers


def fitted_token_budget(config: dict, budget: int, max_row_len: int, cap_bytes: float,
                        dtype_bytes: int = 4, step: int = 128) -> int:
    """The token budget a rank runs at under `actor.micro_batch_activation_gib`: `budget` itself
    if a forward of that many tokens keeps at most `cap_bytes` of activations for backward, else
    the largest multiple of `step` below it that does (at least `step`, never more than
    `budget`; a row longer than the budget still runs, alone). Rows are at most `max_row_len`
    long (0: the budget)."""
    def fits(tokens: int) -> bool:
        row = min(max_row_len or tokens, tokens)
        return stored_activation_bytes(config, tokens, row, dtype_bytes) <= cap_bytes

    if cap_bytes <= 0 or budget <= 0 or fits(budget):
        return budget
    tokens = (budget - 1) // step * step
    while tokens > step and not fits(tokens):
        tokens -= step
    return min(budget, max(tokens, step))


def training_state_bytes(trainable_params_per_rank: int) -> int:
    """What the first optimizer step adds on a rank: fp32 gradients and AdamW's two moments of
    its shard (FSDP2 keeps fp32 master weights even under bf16 compute)."""
    return 3 * 4 * trainable_params_per_rank


def choose_recomputation(setting: str, activations: int, state: int, available: int,
                         local_ranks: int, headroom: float = 0.5) -> tuple[bool, str]:
    """(recompute?, the start-up line saying why). `available`: memory free on the node now
    (host RAM on CPU, device memory on GPU), shared by `local_ranks` ranks; a rank may plan on
    `headroom` of its share, the rest left for engines still starting beside it, the transient
    all-gathered layers and the allocator's slack (the estimate itself is an upper bound)."""
    need = activations + state
    share = headroom * available / max(1, local_ranks)
    numbers = (f"activations ~{activations / GiB:.2f} GiB + optimizer state {state / GiB:.2f} GiB "
               f"a rank against {share / GiB:.1f} GiB ({headroom:.0%} of {available / GiB:.1f} "
               f"GiB free / {local_ranks} rank(s) here)")
    if setting != "auto":
        on = setting == "true"
        return on, (f"recomputation {'on' if on else 'off'} (actor.gradient_checkpointing="
                    f"{setting}; estimate: {numbers})")
    on = need > share
    return on, f"recomputation {'on' if on else 'off'} (auto: {numbers})"
