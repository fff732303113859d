"""`peer-rl plan` for a supervised stage's recipe (`peer-rl sft`, `peer-rl train-rm`): its Ray
Train workers placed as Ray Train places them (one PACK group of trainer.world_size bundles of
resources.*), and each rank's memory with the GRPO policy rank's arithmetic
(peer_rl.planning.memory.fsdp_rank): FSDP2 shards of the fp32 weights, gradients and AdamW
moments (LoRA: the adapters), no reference, activations of one micro-batch at
trainer.max_length (peer_rl.workers.supervised pads a micro-batch to its longest row, which
max_length bounds), recomputed per layer with model.gradient_checkpointing.

The output layer: the sft and judge stages take float32 logits over every position where some
row of the micro-batch has a target (peer_rl.workers.supervised.TokenCrossEntropy), at most all
of them, sized as the log-prob head over micro_batch_size x max_length positions; the
Bradley-Terry stage's score head has one output and no vocabulary-wide logits."""
from __future__ import annotations

from peer_rl.compute.precision import BYTES, resolve_dtype
from peer_rl.config.schema import ConfigError, load_config
from peer_rl.models.local import BUNDLED
from peer_rl.planning import memory
from peer_rl.planning.cluster import Node
from peer_rl.planning.placement import Placement
from peer_rl.planning.plan import Plan, check_fit, first_fitting
from peer_rl.planning.pools import bundle
from peer_rl.planning.shapes import NAMED, model_shape
from peer_rl.supervised.config import COMMAND_KINDS, SupervisedConfig, check_supervised

POOL = "train"          # the Ray Train worker group's name in the plan
ROLE = {"sft": "policy", "rm": "judge", "prm": "judge", "orm": "judge", "bt": "reward model"}


def command(kind: str) -> str:
    return next(c for c, kinds in COMMAND_KINDS.items() if kind in kinds)


def load(overrides: list[str]):
    """The supervised config `recipe=` names, checked as its command checks it, except that a
    recipe's placeholder model.path is named with the shapes plan takes instead."""
    def check(cfg):
        path = cfg.model.path
        if path.startswith("<") and path.endswith(">"):
            raise ConfigError(f"model.path: recipe {cfg.recipe!r} needs a starting model, "
                              f"{path}: pass model.path=DIR or a named shape "
                              f"({', '.join(NAMED)})")
        check_supervised(cfg)

    return load_config(list(overrides), schema=SupervisedConfig, check=check)


def _model(cfg) -> str:
    """model.path, or the shipped tiny model the stage trains without one (the tiny reward
    model is built from the tiny policy, so that shape stands in for it)."""
    if cfg.model.path:
        return cfg.model.path
    return str(BUNDLED / "models" / "tiny" / ("judge" if cfg.kind in ("rm", "prm", "orm")
                                              else "policy"))


def _params(cfg, shape) -> int:
    """Parameters the stage trains: a Bradley-Terry model planned from a causal LM's shape
    (config.json or a named shape, no weights to count) has a one-output score head in place
    of an untied output layer."""
    config, params, _, where = shape
    if cfg.kind != "bt" or "weights headers" in where:
        return params
    from peer_rl.compute.kv_cache import text_config

    t = text_config(config)
    tied = t.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    return params - (0 if tied else t["vocab_size"] * t["hidden_size"]) + t["hidden_size"]


def micro_batch_tokens(cfg) -> int:
    """Positions of one rank's forward: micro_batch_size rows (bt: pairs, two rows each) of at
    most max_length."""
    t = cfg.trainer
    return (2 if cfg.kind == "bt" else 1) * t.micro_batch_size * t.max_length


def rank_estimate(cfg, shape, gpu_gib: float) -> memory.Estimate:
    """One Ray Train worker's FSDP2 rank (memory.fsdp_rank): on its GPU in the compute dtype
    trainer.dtype resolves to there, or in host memory on a CPU (auto: float32, the dtype of
    a CPU without AVX512-BF16/AMX)."""
    on_gpu = bool(cfg.resources.gpus_per_worker)
    dtype = resolve_dtype(cfg.trainer.dtype, on_gpu, cpu_bf16=False, key="trainer.dtype")
    device = (memory.Device("GPU", BYTES[dtype], memory.CUDA_CONTEXT) if on_gpu
              else memory.cpu_device(dtype))
    config, _, vision, _ = shape
    tokens = micro_batch_tokens(cfg)
    est = memory.fsdp_rank(POOL, config, _params(cfg, shape), vision, cfg.trainer.world_size,
                           cfg.model.freeze_vision_tower, cfg.model.lora, tokens,
                           0 if cfg.kind == "bt" else tokens,
                           "true" if cfg.model.gradient_checkpointing else "false",
                           False, gpu_gib, device)
    rows = "pair(s) x 2" if cfg.kind == "bt" else "row(s)"
    head = ("" if cfg.kind == "bt" else "; the log-prob head over all of them, at most (logits "
            "are taken where some row has a target)")
    est.detail = (f"micro-batch {cfg.trainer.micro_batch_size} {rows} x max_length "
                  f"{cfg.trainer.max_length} = {tokens} tokens, {dtype}; " + est.detail + head)
    return est


def make_supervised_plan(cfg, nodes: list[Node]) -> Plan:
    """The stage's workers placed (one PACK group) and each rank's estimate."""
    b = bundle(cfg.resources)
    placement = Placement(nodes)
    missing = placement.place(POOL, b, cfg.trainer.world_size, "PACK")
    shape = model_shape(_model(cfg))
    gpu_gib = min(n.gpu_memory_gib for n in nodes)
    est = rank_estimate(cfg, shape, gpu_gib)
    plan = Plan(nodes, {POOL: cfg.trainer.world_size}, placement.slots,
                [missing] if missing else [], {POOL: [est]}, {ROLE[cfg.kind]: shape[3]},
                bundles={POOL: b})
    check_fit(plan)
    # the stage's resources are one section, not one per pool
    plan.problems = [p.replace(f"resources.{POOL}:", "resources:") for p in plan.problems]
    return plan


def step_tokens(cfg) -> int:
    """Tokens an optimizer step trains at most: batch_size rows (bt: pairs, two rows each) at
    max_length."""
    t = cfg.trainer
    return (2 if cfg.kind == "bt" else 1) * t.batch_size * t.max_length


def tokens_line(cfg) -> str:
    t = cfg.trainer
    rows = f"{t.batch_size} pairs x 2" if cfg.kind == "bt" else f"{t.batch_size} rows"
    return (f"tokens per step (rows at trainer.max_length, the longest kept): {rows} x "
            f"{t.max_length:,} = {step_tokens(cfg):,} tokens trained, at most")


CANDIDATES = (["model.gradient_checkpointing=true"], ["trainer.micro_batch_size=1"],
              ["model.gradient_checkpointing=true", "trainer.micro_batch_size=1"],
              ["model.lora.rank=64"], ["model.lora.rank=64", "model.gradient_checkpointing=true"],
              ["model.lora.rank=64", "trainer.micro_batch_size=1"])


def fitting_fixes(overrides: list[str], nodes: list[Node], limit: int = 3) -> list[list[str]]:
    """Up to `limit` of CANDIDATES (recomputation, one row a micro-batch, LoRA) with which the
    stage fits, each planned again; LoRA not for bt (it trains its full weights)."""
    return first_fitting(CANDIDATES, lambda fix: make_supervised_plan(
        load(list(overrides) + fix), nodes).fits, limit)
