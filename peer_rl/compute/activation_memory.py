"""Whether the policy ranks recompute decoder activations in backward
(`actor.gradient_checkpointing: auto`): the activations one training forward at the token budget
would keep, estimated from the model's config, against the memory a rank may still use.

Recomputation costs about a third more update compute, so it is worth it only where the
activations would not fit: off for the tiny recipe's policy (~0.2 GB a rank), on for a ~100M
policy at a 4,096-token budget beside two engines on a 24 GB machine (measured ~9 GB a rank
without it, ~5 GB with).
"""
from __future__ import annotations

from dataclasses import dataclass

from peer_rl.compute.kv_cache import text_config

GiB = 2**30
SETTINGS = ("auto", "true", "false")


LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Trained:
    """What a training forward computes in and what trains: the compute dtype's bytes, and
    LoRA adapters of `lora_rank` on the decoder layer's linear layers named in `adapted`
    (rank 0: full weights, every linear layer and the norms train)."""
    dtype_bytes: int = 4
    lora_rank: int = 0
    adapted: tuple[str, ...] = LINEAR


def adapted_linears(targets) -> tuple[str, ...]:
    """The decoder layer's linear layers a LoRA target list names ("all-linear": all 7)."""
    targets = list(targets)
    return LINEAR if "all-linear" in targets else tuple(n for n in LINEAR if n in targets)


def trained_for(dtype_bytes: int, lora=None) -> Trained:
    """`Trained` for a compute dtype and model.lora (None or rank 0: full weights)."""
    if lora is None or not lora.rank:
        return Trained(dtype_bytes)
    return Trained(dtype_bytes, lora.rank, adapted_linears(lora.target_modules))


def layer_activation_bytes(config: dict, trained: Trained = Trained()) -> int:
    """What one decoder layer keeps for backward per token, with SDPA attention as the policy
    runs it (packed rows or transformers' "sdpa": its flash and memory-efficient kernels keep
    Q, K, V, the output and a float32 log-sum-exp per head, never the attention
    probabilities). Always: those, 3 MLP-width values (gate, up, the activation: the product's
    and the activation's inputs) and both norms' float32 inputs (the norms upcast). A linear
    layer that trains keeps its input too (q/k/v share one, gate/up one; o's is the attention
    output reshaped, down's the MLP product); a frozen one keeps only its weight. Full weights
    keep both norms' outputs (their weights train); LoRA each adapter's rank-wide hidden.
    Held against what autograd saves in the policy worker's own forward
    (tests/workers/test_policy_activations.py)."""
    t = text_config(config)
    h, i, heads = t["hidden_size"], t["intermediate_size"], t["num_attention_heads"]
    kv = (t.get("num_key_value_heads") or heads) * (t.get("head_dim") or h // heads)
    full = not trained.lora_rank
    trains = set(LINEAR if full else trained.adapted)
    inputs = (h * bool(trains & {"q_proj", "k_proj", "v_proj"}) + h * ("o_proj" in trains)
              + h * bool(trains & {"gate_proj", "up_proj"}) + i * ("down_proj" in trains))
    values = 2 * h + 2 * kv + 3 * i + inputs + (2 * h if full else trained.lora_rank * len(trains))
    return trained.dtype_bytes * values + 2 * 4 * h + 4 * heads


def stored_activation_bytes(config: dict, tokens: int, trained: Trained = Trained()) -> int:
    """What a training forward of `tokens` tokens keeps for backward over all decoder layers,
    without recomputation."""
    layers = text_config(config)["num_hidden_layers"]
    return layer_activation_bytes(config, trained) * tokens * layers


def recomputed_activation_bytes(config: dict, tokens: int, trained: Trained = Trained()) -> int:
    """The same forward with each decoder layer recomputed in backward: every layer keeps only
    its input (one hidden-size vector per token), and one layer's activations are live again
    while its backward runs."""
    text = text_config(config)
    inputs = text["hidden_size"] * trained.dtype_bytes * tokens * text["num_hidden_layers"]
    return inputs + layer_activation_bytes(config, trained) * tokens


def logprob_head_bytes(config: dict, chunk_tokens: int) -> int:
    """The output layer's peak over one chunk of actor.logits_chunk_size positions
    (peer_rl.compute.token_logprobs), in its backward: 5 float32 chunk x vocabulary tensors at once (the
    recomputed logits, the log-sum-exp's gradient, the gather's, their sum, and the bfloat16
    cast's input; the forward holds 3). For SmolLM2's 49,152-token vocabulary and 1,024
    positions: 0.94 GiB."""
    return 5 * 4 * chunk_tokens * text_config(config)["vocab_size"]


def fitted_token_budget(config: dict, budget: int, cap_bytes: float,
                        trained: Trained = Trained(), step: int = 128) -> int:
    """The token budget a rank runs at under `actor.micro_batch_activation_gib`: `budget` itself
    if a forward of that many tokens keeps at most `cap_bytes` of activations for backward, else
    the largest multiple of `step` below it that does (at least `step`, never more than
    `budget`; a row longer than the budget still runs, alone)."""
    def fits(tokens: int) -> bool:
        return stored_activation_bytes(config, tokens, trained) <= cap_bytes

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
