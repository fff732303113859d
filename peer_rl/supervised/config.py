"""Typed schema of the supervised stages: `peer-rl train-rm` (UnifiReward on SER) and `peer-rl sft`.

Same mechanics as the GRPO schema (peer_rl/config/schema.py): a dataclass tree given to omegaconf, a
recipe chosen by `recipe=NAME`, dotted `key=value` overrides, an unknown key or a wrong type
failing at start-up naming the key, then the value checks below.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal, get_args

from omegaconf import MISSING, DictConfig

from peer_rl.compute.precision import DType
from peer_rl.config.schema import (ConfigError, LoggingConfig, RayConfig, check_lora, check_ranges,
                            load_config)
from peer_rl.config.worker_settings import LoRASettings

# rm: UnifiReward SFT on SER chats; prm / orm: the separate process and outcome judges PEER
# compares it with, on the same SER rows; bt: a scalar reward model on preference pairs
# (Bradley-Terry; ESCRAG-R1); all run as `peer-rl train-rm`. sft: the policy (`peer-rl sft`).
Kind = Literal["rm", "prm", "orm", "bt", "sft"]
KINDS = get_args(Kind)
JUDGE_KINDS = {"rm": "unified", "prm": "process", "orm": "outcome"}   # kind -> SER view / role
DEFAULT_RECIPE = {"rm": "unifireward_tiny", "prm": "prm_tiny", "orm": "orm_tiny",
                  "bt": "escrag_rm_tiny", "sft": "sft_tiny"}
COMMAND_KINDS = {"train-rm": ("rm", "prm", "orm", "bt"), "sft": ("sft",)}


@dataclass
class SupervisedDataConfig:
    root: str = ""                          # PEER-layout root; "" = the bundled sample
    # Paths relative to root; globs allowed in the file part (ser/*/*_train.jsonl). ser/ files
    # train the 4 verdict turns, sft/ files the last assistant turn.
    train_files: list[str] = field(default_factory=lambda: ["ser/*/*_train.jsonl"])
    skip_invalid: bool = False              # drop (and count) invalid rows instead of failing
    max_rows: int = 0                       # 0 = all rows (a cap is handy for smoke runs)
    # only rows in these languages (english, chinese; [] = all), the others counted
    languages: list[str] = field(default_factory=list)


@dataclass
class SupervisedModelConfig:
    # HF model dir; "" = tiny random judge (rm) / policy (sft); "<...>" = a placeholder to set
    path: str = ""
    tiny_cache_dir: str = ""                # where tiny models are built ("" = $XDG_CACHE_HOME/peer-rl/tiny-vl2, ~/.cache by default)
    gradient_checkpointing: bool = False    # recompute activations (large models)
    # vision-language models: the vision encoder gets no gradient and no optimizer state (the
    # aligner/merger still trains); ignored for text-only models
    freeze_vision_tower: bool = True
    # LoRA adapters instead of full weights (rank 0 = full); final/ is the merged model plus
    # final/adapter/ in PEFT's format. `merge` is the GRPO engines' setting and unused here
    lora: LoRASettings = field(default_factory=LoRASettings)


@dataclass
class SupervisedJudgeConfig:
    """train-rm (kinds rm, prm, orm): the wording the judge is trained with, saved beside it."""
    # a judge_template.json (e.g. from `peer-rl judge-template fit`); "" = the one saved with
    # model.path, else the built-in one (the data card's layout)
    template: str = ""
    # strict: stop before training when any SER row differs from the template (count + the
    # first rows, exit 2); warn: train anyway and say so; off: do not check
    template_check: Literal["strict", "warn", "off"] = "strict"


@dataclass
class SupervisedTrainerConfig:
    output_dir: str = "outputs/${experiment_name}"
    total_steps: int = 0                    # optimizer steps; 0 = epochs x ceil(rows / batch_size)
    epochs: int = 1                         # used when total_steps is 0
    lr: float = 1e-5
    lr_scheduler: Literal["constant", "cosine"] = "constant"   # cosine: to min_lr_ratio x lr
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    batch_size: int = 8                     # sequences per optimizer step, all ranks together
    micro_batch_size: int = 4               # sequences per forward/backward on one rank
    max_length: int = 1024                  # longer chats are dropped (and counted), never cut
    save_freq: int = 0                      # checkpoint every k steps (0: only at the end)
    keep_checkpoints: int = 2               # Ray Train CheckpointConfig(num_to_keep)
    log_freq: int = 10                      # print / metrics.jsonl every k steps
    world_size: int = 1                     # Ray Train workers = FSDP2 ranks
    max_failures: int = 0                   # Ray Train FailureConfig: worker-group restarts
    seed: int = 0
    # compute dtype (fp32 master weights and optimizer either way): auto | float32 | bfloat16;
    # auto: bfloat16 on GPUs and on CPUs with AVX512-BF16 or AMX (peer_rl.compute.precision)
    dtype: DType = "auto"
    # judges (rm, prm, orm): weight each verdict by its class so that, at every verdict position
    # (step 1-3, the preference), each label weighs the same in total (SER steps are ~64% True:
    # an unweighted judge learns to answer True); the loss is then a weighted token mean
    verdict_balance: bool = False


@dataclass
class SupervisedResourcesConfig:
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0            # > 0 (or CUDA present): use_gpu, nccl


@dataclass
class SupervisedConfig:
    recipe: str = "unifireward_tiny"
    experiment_name: str = MISSING
    kind: Kind = "rm"                       # rm, prm, orm, bt (train-rm) | sft
    # auto: continue from the newest checkpoint of this output_dir (Ray Train's run snapshot);
    # disable: start fresh (refuses to run over existing checkpoints).
    resume: Literal["auto", "disable"] = "auto"
    data: SupervisedDataConfig = field(default_factory=SupervisedDataConfig)
    model: SupervisedModelConfig = field(default_factory=SupervisedModelConfig)
    judge: SupervisedJudgeConfig = field(default_factory=SupervisedJudgeConfig)
    trainer: SupervisedTrainerConfig = field(default_factory=SupervisedTrainerConfig)
    resources: SupervisedResourcesConfig = field(default_factory=SupervisedResourcesConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)   # .verbose: workers' start-up output


_POSITIVE = ("trainer.epochs", "trainer.batch_size", "trainer.micro_batch_size",
             "trainer.max_length", "trainer.world_size", "trainer.log_freq",
             "trainer.keep_checkpoints")
_NON_NEGATIVE = ("trainer.total_steps", "trainer.lr", "trainer.warmup_steps",
                 "trainer.min_lr_ratio", "trainer.weight_decay", "trainer.grad_clip",
                 "trainer.save_freq", "trainer.max_failures", "data.max_rows",
                 "resources.cpus_per_worker", "resources.gpus_per_worker", "model.lora.rank")


def check_supervised(cfg: DictConfig) -> None:
    path = cfg.model.path
    if path.startswith("<") and path.endswith(">"):     # a recipe's placeholder: must be set
        raise ConfigError(f"model.path: recipe {cfg.recipe!r} needs a starting model, {path} (an "
                          "HF model directory); pass model.path=/path/to/model")
    check_ranges(cfg, _POSITIVE, _NON_NEGATIVE)   # the closed choices are Literal fields
    check_lora(cfg.model.lora)
    if cfg.model.lora.rank and cfg.kind == "bt":
        raise ConfigError(f"model.lora.rank={cfg.model.lora.rank}: the Bradley-Terry reward "
                          "model (kind bt) trains its score head and full weights; set "
                          "model.lora.rank=0")
    if not cfg.data.train_files:
        raise ConfigError("data.train_files: expected at least one file (e.g. ser/*/*_train.jsonl)")
    for rel in cfg.data.train_files:
        parts = Path(rel).parts
        allowed = {"bt": ("preference",), "rm": ("ser",), "prm": ("ser",),
                   "orm": ("ser",)}.get(cfg.kind, ("sft", "cold_start"))
        if len(parts) < 2 or parts[0] not in allowed:
            raise ConfigError(f"data.train_files: {rel!r}: expected a path under "
                              f"{' or '.join(a + '/' for a in allowed)} relative to data.root "
                              f"(kind={cfg.kind})")
    if cfg.judge.template and not Path(cfg.judge.template).is_file():
        raise ConfigError(f"judge.template={cfg.judge.template!r}: no such file (expected a "
                          "judge_template.json, e.g. from `peer-rl judge-template fit`)")
    if cfg.trainer.verdict_balance and cfg.kind not in JUDGE_KINDS:
        raise ConfigError(f"trainer.verdict_balance=true: it weighs a judge's verdicts by class "
                          f"(kinds {', '.join(JUDGE_KINDS)}), not kind={cfg.kind}")
    if cfg.trainer.min_lr_ratio > 1:
        raise ConfigError(f"trainer.min_lr_ratio={cfg.trainer.min_lr_ratio}: expected <= 1")


def load_supervised_config(overrides=(), kind: str = "rm") -> DictConfig:
    """Schema <- recipe (default: the tiny CPU recipe of `kind`) <- overrides; kind must match."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
    cfg = load_config(list(overrides), schema=SupervisedConfig,
                      default_recipe=DEFAULT_RECIPE[kind], check=lambda c: None)
    command = next(c for c, kinds in COMMAND_KINDS.items() if kind in kinds)
    if cfg.kind != kind and cfg.kind in KINDS and cfg.kind not in COMMAND_KINDS[command]:
        right = next(c for c, kinds in COMMAND_KINDS.items() if cfg.kind in kinds)
        raise ConfigError(f"recipe={cfg.recipe!r} is a kind={cfg.kind!r} recipe; run it with "
                          f"`peer-rl {right}` (this is `peer-rl {command}`)")
    check_supervised(cfg)
    return cfg


# TrainLoopConfig fields that say where or how verbosely a stage runs, not what it learns
RUN_ONLY_FIELDS = ("model_path", "data_root", "output_dir", "verbose", "cpus_per_worker",
                   "use_gpu")


@dataclass(frozen=True)
class TrainLoopConfig:
    """What every rank of a supervised stage is given (peer_rl.workers.supervised.train_loop),
    built once by the launcher (peer_rl.trainer.supervised_run.plan_stage) from the config
    above. Plain data, so Ray Train pickles it to the workers; no field has a default, so a
    field the launcher leaves out or misspells fails there, and the loop reads attributes."""
    # what the model learns
    kind: str                       # KINDS: bt trains on pairs, the others on target tokens
    train_files: tuple[str, ...]
    skip_invalid: bool
    max_rows: int
    max_length: int
    languages: tuple[str, ...]
    batch_size: int                 # sequences (bt: pairs) per optimizer step, all ranks
    micro_batch_size: int           # per forward/backward on one rank
    total_steps: int                # resolved: never 0
    lr: float
    lr_scheduler: str
    warmup_steps: int
    min_lr_ratio: float
    weight_decay: float
    grad_clip: float
    save_freq: int
    log_freq: int
    seed: int
    dtype: str
    gradient_checkpointing: bool
    freeze_vision_tower: bool
    extra_files: dict[str, str]     # saved beside the model: the template it was trained with
    verdict_balance: bool
    lora: LoRASettings              # rank 0: full weights
    # where and how verbosely it runs (RUN_ONLY_FIELDS)
    model_path: str
    data_root: str
    output_dir: str
    verbose: bool
    cpus_per_worker: float
    use_gpu: bool

    def training_inputs(self) -> dict:
        """The fields that say what the model learns, as the shipped models' manifests digest
        them (peer_rl.trainer.tiny_cache.config_inputs): verdict_balance and lora only when on,
        so the digests of the stages that leave them off stay as they were."""
        inputs = {f.name: getattr(self, f.name) for f in fields(self)
                  if f.name not in (*RUN_ONLY_FIELDS, "verdict_balance", "lora")}
        if self.verdict_balance:
            inputs["verdict_balance"] = True
        if self.lora.rank:
            inputs["lora"] = {"rank": self.lora.rank, "lora_alpha": self.lora.lora_alpha,
                              "target_modules": list(self.lora.target_modules),
                              "lora_adapter_path": self.lora.lora_adapter_path}
        return inputs
