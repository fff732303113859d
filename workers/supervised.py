"""Supervised fine-tuning with Ray Train: `peer-rl train-rm` (UnifiReward on SER) and `peer-rl sft`.

This module is the loop that runs on the Ray Train workers; its launcher (driver side) is
peer_rl.trainer.supervised_run.run_supervised, which starts a Ray Train `TorchTrainer` (Train V2,
Ray's default since 2.5x) whose `train_loop` runs on `trainer.world_size` workers, each an
FSDP2 rank (`fully_shard` per decoder layer, then the root; gloo on CPU, nccl on GPU; Ray Train
sets up the process group). When it finishes, the driver copies the newest checkpoint's
model into `<trainer.output_dir>/final` (final.tmp, then rename), with the judge prompt template
for a reward model.

Checkpoints (every trainer.save_freq steps and at the end), reported with
`ray.train.report(..., checkpoint=...)` and merged by Ray Train into
`<output_dir>/ray_train/run/step_N/`:
    model/                HF format, fp32 master weights, safetensors (rank 0); with
                          model.lora.rank > 0 the adapters merged, and model/adapter/ in PEFT's
                          format (what a resume trains on from the base model.path)
    optim/                AdamW state, torch.distributed.checkpoint shards in safetensors
                          files (every rank writes its slices; loadable at another world size)
    trainer_state.json    step, examples, world size (rank 0)
Nothing is unpickled on load. Resuming is Ray Train's own mechanism: a new run with the same
RunConfig(storage_path, name) reloads the run snapshot and `ray.train.get_checkpoint()` returns
the newest checkpoint, in a restarted worker group (FailureConfig.max_failures) or in a later
`peer-rl train-rm`/`sft` call on the same output_dir (`resume=auto`, the default). The data order
is a function of (seed, step), so a resumed run sees the batches an uninterrupted one would.

The loop is one loop for every kind: `train_loop(config)` (a
peer_rl.supervised.config.TrainLoopConfig the launcher builds) joins the group, reads the
examples, loads the model (from the newest checkpoint on a resume), then takes each step
(`_train_step`), logs the window of steps since the last log line (`_log_window`) and saves
(`_save_step`). What differs between kinds is the objective, which gives the examples and
scores a micro-batch: TokenCrossEntropy (sft, rm, prm, orm: token-mean cross-entropy over the
target tokens of the whole global batch, labels from peer_rl.supervised.examples, -100 on prompt
tokens; with trainer.verdict_balance a weighted mean, each verdict's tokens at its class
weight) or BradleyTerry (bt: the mean -log sigmoid(r_chosen - r_rejected) over the global
batch's pairs, and the train pairwise accuracy). Either loss is a mean over the whole global
batch, so world_size 1 and 2 take the same step.
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from peer_rl.compute.precision import cpu_has_bf16, resolve_dtype
from peer_rl.supervised.examples import (batch_indices, collate, count_targets, example_view,
                                         load_examples, lr_schedule, rank_rows)
from peer_rl.tracking.metrics import MetricsSink

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from peer_rl.config.worker_settings import LoRASettings
    from peer_rl.supervised.config import TrainLoopConfig

RUN_NAME = "run"                 # RunConfig(name); storage_path = <output_dir>/ray_train
STATE_FILE = "trainer_state.json"
TRAIN_TIME_FILE = "train_time.json"    # wall seconds of the Ray Train run that made final/


def _quiet_train_reports() -> None:
    """Ray Train logs each report (every metric, the checkpoint path) at INFO under a logger
    named by its file's path, outside the `ray.train` tree that LoggingConfig sets."""
    try:
        from ray.train.v2._internal.execution import context  # deferred: ray
    except ImportError:           # another Ray: its reports keep their level
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


# ============================================================================ worker side
def _prepare_model(model, gradient_checkpointing: bool, freeze_vision: bool):
    """The loaded (rank 0) or meta-built (other ranks) model made ready to shard: vision tower
    frozen, HF's gradient checkpointing, train mode only where there is dropout."""
    import torch  # deferred: torch (~2 s); the CLI starts without it

    from peer_rl.workers import fsdp  # deferred: pulls in torch

    if freeze_vision and fsdp.vision_tower(model) is not None:
        fsdp.freeze_vision_tower(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    if not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        model.eval()   # no dropout anywhere: eval mode is identical and skips train-only paths
    return model


def vision_inputs(model_path: str):
    """peer_rl.workers.vision.VisionInputs for a vision-language checkpoint, None for a text model."""
    from peer_rl.workers import fsdp  # deferred: pulls in torch

    if not fsdp.is_vision_language(model_path):
        return None
    from peer_rl.workers.vision import VisionInputs  # deferred: pulls in torch

    return VisionInputs(model_path)


def image_token_counter(vision):
    """(image token id, path -> tokens) for peer_rl.supervised.examples.build_examples, or None."""
    if vision is None:
        return None
    return vision.image_token_id, lambda path: vision.tokens(path)


def lora_weights(settings: LoRASettings, model_path: str, resume_dir: Path | None):
    """What a stage trains (peer_rl.workers.lora): full weights, or LoRA adapters of `settings`
    (model.lora) that a resume takes from its checkpoint's model/adapter/. A checkpoint of the
    other kind stops the resume naming the key."""
    from peer_rl.workers import lora  # deferred: pulls in torch

    saved = resume_dir is not None and (resume_dir / "model" / "adapter").is_dir()
    if resume_dir is not None and saved != bool(settings.rank):
        what = "LoRA adapters" if saved else "full weights"
        raise ValueError(f"{resume_dir}: the checkpoint holds {what}, but {lora.KEY}.rank="
                         f"{settings.rank}: resume with the setting it was trained with")
    if not settings.rank:
        return lora.FullWeights()
    if saved:
        settings = replace(settings, lora_adapter_path=str(resume_dir / "model" / "adapter"))
    return lora.Adapters(settings, model_path)


def _save_checkpoint(directory: Path, model, optim, rank: int, src_dir: str, state: dict,
                     extra_files: dict[str, str], drop: set[str], weights=None) -> None:
    """Collective. Rank 0: model/ (HF, safetensors; LoRA: the adapters merged, and adapter/
    in PEFT's format) + trainer_state.json; every rank: its slices of the AdamW state (optim/,
    peer_rl.workers.fsdp.save_sharded: loadable at another world size; LoRA: the adapters' only)."""
    import torch.distributed as dist  # deferred: torch (~2 s); the CLI starts without it
    from safetensors.torch import save_file  # deferred: safetensors (pulls in torch)

    from peer_rl.workers import fsdp  # deferred: pulls in torch

    sd = fsdp.full_state_dict(model)
    if rank == 0:
        mdir = directory / "model"
        fsdp.copy_model_files(src_dir, mdir)
        for name, text in extra_files.items():
            (mdir / name).write_text(text, encoding="utf-8")
        if weights is not None and weights.on:
            merged = {k: v.detach().cpu().clone() for k, v in weights.hf_state(sd).items()
                      if k not in drop}
            save_file(fsdp.to_checkpoint_names(model, merged), str(mdir / "model.safetensors"),
                      metadata={"format": "pt"})
            weights.save_adapter(sd, mdir / "adapter")
            for name, text in extra_files.items():   # a judge adapter is served with its template
                (mdir / "adapter" / name).write_text(text, encoding="utf-8")
        else:
            sd = {k: v for k, v in sd.items() if k not in drop}
            model.save_pretrained(mdir, state_dict=sd, max_shard_size="5GB")
        (directory / STATE_FILE).write_text(json.dumps(state, indent=1), encoding="utf-8")
    del sd
    fsdp.save_sharded(directory / "optim", model, optim, rank, include_model=False)
    dist.barrier()


# ---------------------------------------------------------------------------- the objectives
# What a step's micro-batches are and how they are scored: each holds its examples and gives
# the units a global batch's loss is a mean over, and one micro-batch's summed loss (the loop
# scales and backpropagates it) with its hits (pairs scored the right way; 0 where none).
def load_objective(config: TrainLoopConfig, tokenizer):
    """The objective of config.kind over its examples (every rank reads the same files, and
    tokenizing is deterministic, so the ranks agree on every index)."""
    pad_id = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
              else tokenizer.eos_token_id)
    if config.kind == "bt":
        from peer_rl.supervised.bradley_terry import load_pairs  # deferred: pulls in torch

        pairs, _ = load_pairs(config.data_root, list(config.train_files), tokenizer,
                              config.max_length, config.skip_invalid, config.max_rows)
        return BradleyTerry(pairs, pad_id)

    vision = vision_inputs(config.model_path)
    examples, _ = load_examples(config.data_root, list(config.train_files), tokenizer,
                                config.max_length, config.skip_invalid, config.max_rows,
                                image_tokens=image_token_counter(vision),
                                languages=list(config.languages),
                                verdict_balance=config.verdict_balance,
                                **example_view(config.kind, config.extra_files))
    return TokenCrossEntropy(examples, pad_id, vision)


class TokenCrossEntropy:
    """sft and the judges (rm, prm, orm): cross-entropy summed over the target tokens (labels
    from peer_rl.supervised.examples, -100 on prompt tokens), a token mean over the global
    batch; with trainer.verdict_balance each verdict's tokens at its class weight."""

    def __init__(self, examples: list[dict], pad_id: int, vision=None):
        self.examples, self.pad_id, self.vision = examples, pad_id, vision

    def units(self, indices: list[int]) -> float:
        """The global batch's target tokens (at least 1)."""
        return max(1, sum(count_targets(self.examples[i]) for i in indices))

    def micro_batch(self, model, chunk: list[dict], real: list[bool], device):
        import torch  # deferred: torch (~2 s); the CLI starts without it
        import torch.nn.functional as F  # deferred: torch (~2 s); the CLI starts without it

        batch = collate(chunk, self.pad_id, real)
        extra = {}
        if self.vision is not None:     # the frames of visual rows (peer_rl.workers.vision)
            extra = self.vision(batch["input_ids"], [e["images"] for e in chunk])
        batch = {key: v.to(device) for key, v in (batch | extra).items()}
        # logits only where some row has a target (the lm_head over the vocabulary is the
        # largest matmul of a small model, and SER chats have ~10 target tokens in ~500)
        targets = batch["labels"][:, 1:]
        verdict_w = batch.pop("weights", None)     # trainer.verdict_balance
        keep = (targets != -100).any(0).nonzero().squeeze(1)
        if keep.numel() == 0:               # padding rows only: same graph, zero loss
            keep = torch.zeros(1, dtype=torch.long, device=device)
        logits = model(**{k: v for k, v in batch.items() if k != "labels"},
                       use_cache=False, logits_to_keep=keep).logits.float()
        ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                             targets[:, keep].reshape(-1), ignore_index=-100,
                             reduction="none" if verdict_w is not None else "sum")
        if verdict_w is not None:
            ce = (ce * verdict_w[:, 1:][:, keep].reshape(-1)).sum()
        return ce, 0.0

    def window_metrics(self, window: Window) -> dict:
        return {}

    def rate(self, last: dict) -> str:
        return f"{last['target_tokens_per_s']:.0f} target tok/s"


class BradleyTerry:
    """bt: the scalar reward model on preference pairs (peer_rl.supervised.bradley_terry),
    -log sigmoid(r_chosen - r_rejected) summed over the pairs, a mean over the global batch's
    pairs; its hits give the train pairwise accuracy (a tie counts half)."""

    def __init__(self, pairs: list[dict], pad_id: int):
        self.examples, self.pad_id = pairs, pad_id

    def units(self, indices: list[int]) -> float:
        """The global batch's pairs."""
        return len(indices)

    def micro_batch(self, model, chunk: list[dict], real: list[bool], device):
        import torch  # deferred: torch (~2 s); the CLI starts without it

        # deferred: pulls in torch
        from peer_rl.supervised.bradley_terry import bt_loss, collate_pairs

        ok = torch.tensor(real, dtype=torch.float32, device=device)
        batch = {key: v.to(device) for key, v in collate_pairs(chunk, self.pad_id).items()}
        scores = model(**batch, use_cache=False).logits[:, 0].float()
        chosen, rejected = scores[:len(chunk)], scores[len(chunk):]
        margin = chosen - rejected
        # the chunk's pairs summed; rank padding pairs weigh 0
        nll = bt_loss(chosen, rejected, ok, reduction="sum")
        hits = (((margin > 0).float() + 0.5 * (margin == 0).float()) * ok).sum()
        return nll, hits.detach().double().cpu()

    def window_metrics(self, window: Window) -> dict:
        return {"pairwise_accuracy": window.accuracy / window.steps}

    def rate(self, last: dict) -> str:      # units/s are pairs/s here
        return (f"{last['target_tokens_per_s']:.1f} pairs/s train acc "
                f"{last['pairwise_accuracy']:.3f}")


# ---------------------------------------------------------------------------- the shared loop
class Rank(NamedTuple):
    """This worker's place in the FSDP2 group Ray Train set up."""
    rank: int
    world_size: int
    device: object          # torch.device
    mesh: object            # the 1-D DeviceMesh every module is sharded over
    dtype: str              # the compute dtype (trainer.dtype resolved for the device)


@dataclass
class Trainee:
    """What a rank trains: its shards of the model, their AdamW and learning-rate schedule, and
    what its checkpoints need (the adapters or full weights, the tied duplicates left out)."""
    model: object
    optim: object
    sched: object
    weights: object         # peer_rl.workers.lora.FullWeights | Adapters
    tied: set[str]


class StepResult(NamedTuple):
    """One optimizer step's numbers, the same on every rank (summed over the ranks)."""
    loss: float             # the global batch's mean loss
    accuracy: float         # hits per unit (bt: the pairwise accuracy; 0 otherwise)
    units: float            # what the mean is over: target tokens or pairs
    grad_norm: float
    lr: float               # the learning rate the step took


@dataclass
class Window:
    """The steps since the last log line: a log line reports their means."""
    loss: float = 0.0
    accuracy: float = 0.0
    units: float = 0.0
    grad_norm: float = 0.0
    steps: int = 0
    t0: float = field(default_factory=time.perf_counter)

    def add(self, result: StepResult) -> None:
        self.loss += result.loss
        self.accuracy += result.accuracy
        self.units += result.units
        self.grad_norm += result.grad_norm
        self.steps += 1


def train_loop(config: TrainLoopConfig) -> None:
    """Ray Train worker function (one FSDP2 rank): the steps from the newest checkpoint (or the
    start) to config.total_steps, logged every log_freq steps, checkpointed every save_freq
    and at the end. `config` is built by the launcher (peer_rl.trainer.supervised_run)."""
    from transformers import AutoTokenizer  # deferred: transformers (~3 s, pulls in torch)

    if not config.verbose:      # the driver draws the progress from metrics.jsonl (StepBar)
        _quiet_train_reports()
    me = _join_group(config)
    objective = load_objective(config, AutoTokenizer.from_pretrained(config.model_path))
    ckpt_dir, start_step = _newest_checkpoint()
    trainee = _load_trainee(config, me, ckpt_dir, start_step)
    if me.rank == 0 and config.verbose:
        _log_start(config, me, len(objective.examples), start_step)
    sink = _metrics_sink(config, me, start_step if ckpt_dir is not None else None)
    window, last = Window(), {}
    for step in range(start_step, config.total_steps):
        result = _train_step(config, me, objective, trainee, step)
        window.add(result)
        done = step + 1
        is_save = done == config.total_steps or (config.save_freq and done % config.save_freq == 0)
        if done % config.log_freq == 0 or is_save or done == start_step + 1:
            last = _log_window(config, me, objective, window, step, result.lr, start_step, sink)
            window = Window()
        if is_save:
            _save_step(config, me, trainee, done, last, len(objective.examples))
    if sink is not None:
        sink.close()


def _join_group(config: TrainLoopConfig) -> Rank:
    """This rank's device and mesh in the process group Ray Train set up, and the seed."""
    import ray.train  # deferred: ray (~1 s); commands that start no cluster run without it
    import torch  # deferred: torch (~2 s); the CLI starts without it
    import torch.distributed as dist  # deferred: torch (~2 s); the CLI starts without it
    from torch.distributed.device_mesh import init_device_mesh  # deferred: torch

    ctx = ray.train.get_context()
    rank, ws = ctx.get_world_rank(), ctx.get_world_size()
    use_cuda = torch.cuda.is_available() and config.use_gpu
    if use_cuda:
        import ray.train.torch as rtt  # deferred: ray
        device = rtt.get_device()
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, int(config.cpus_per_worker)))
    if not dist.is_initialized():   # world_size 1 still goes through the same code path
        raise RuntimeError("Ray Train did not set up torch.distributed")
    mesh = init_device_mesh(device.type, (ws,))
    torch.manual_seed(config.seed)
    dtype = resolve_dtype(config.dtype, use_cuda, cpu_has_bf16(), "trainer.dtype")
    return Rank(rank, ws, device, mesh, dtype)


def _newest_checkpoint() -> tuple[Path | None, int]:
    """(the newest checkpoint's directory, its step), or (None, 0) on a fresh run: what
    ray.train.get_checkpoint() hands a resumed run (remote storage: downloaded once per rank)."""
    import ray.train  # deferred: ray (~1 s); commands that start no cluster run without it

    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        return None, 0
    ckpt_dir = Path(ckpt.path) if ckpt.filesystem.type_name == "local" else None
    if ckpt_dir is None:
        ckpt_dir = Path(ckpt.to_directory(tempfile.mkdtemp(prefix="peer-rl-ckpt-")))
    state = json.loads((ckpt_dir / STATE_FILE).read_text(encoding="utf-8"))
    return ckpt_dir, int(state["step"])


def _load_trainee(config: TrainLoopConfig, me: Rank, ckpt_dir: Path | None,
                  start_step: int) -> Trainee:
    """The model from the checkpoint (LoRA: the base from model_path, the adapters from the
    checkpoint) or from model_path, sharded; its AdamW state restored on a resume."""
    import torch  # deferred: torch (~2 s); the CLI starts without it

    from peer_rl.workers import fsdp  # deferred: pulls in torch

    weights = lora_weights(config.lora, config.model_path, ckpt_dir)
    src = str(ckpt_dir / "model") if ckpt_dir is not None and not weights.on else config.model_path
    tied: set[str] = set()

    def prepare(model):               # every rank, before sharding (rank 0: the weights)
        model = _prepare_model(model, config.gradient_checkpointing, config.freeze_vision_tower)
        tied.update(fsdp.tied_duplicates(model))
        model = weights.wrap(model)  # LoRA: adapters injected, every base weight frozen
        if weights.on and config.gradient_checkpointing:
            # recomputed layers need an input that requires grad, or the frozen embeddings cut
            # the adapters' gradient
            model.enable_input_require_grads()
        return model

    # rank 0 reads the checkpoint on the host; every rank gets its shards by broadcast, on the
    # mesh's device (fsdp.load_from_rank0)
    model = fsdp.load_from_rank0(src, me.mesh, fsdp.mixed_precision(me.dtype), prepare)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                              lr=config.lr, weight_decay=config.weight_decay)
    if ckpt_dir is not None:
        fsdp.load_sharded(ckpt_dir / "optim", model, optim, include_model=False)
        if me.rank == 0:
            log.info(f"resumed from {ckpt_dir.name} (step {start_step}/{config.total_steps})")
    sched = lr_schedule(optim, config.lr, config.total_steps, config.warmup_steps,
                        config.lr_scheduler, config.min_lr_ratio, start_step)
    return Trainee(model, optim, sched, weights, tied)


def _log_start(config: TrainLoopConfig, me: Rank, examples: int, start_step: int) -> None:
    import torch.distributed as dist  # deferred: torch (~2 s); the CLI starts without it

    log.info(f"{me.world_size} rank(s), {dist.get_backend()} on {me.device.type}, {me.dtype} "
             f"compute; {examples} examples; steps {start_step + 1}..{config.total_steps}")


def _metrics_sink(config: TrainLoopConfig, me: Rank, resume_step: int | None):
    """Rank 0 writes metrics.jsonl (and TensorBoard), as the RL runs do; the others nothing."""
    if me.rank != 0:
        return None

    Path(config.output_dir).mkdir(parents=True, exist_ok=True)
    return MetricsSink(Path(config.output_dir), ["jsonl", "tensorboard"], resume_step=resume_step)


def _train_step(config: TrainLoopConfig, me: Rank, objective, trainee: Trainee,
                step: int) -> StepResult:
    """One optimizer step on the global batch of `step` (a function of seed and step), this
    rank's rows in micro-batches; the loss a mean over the whole global batch, so world_size 1
    and 2 take the same step."""
    import torch  # deferred: torch (~2 s); the CLI starts without it
    import torch.distributed as dist  # deferred: torch (~2 s); the CLI starts without it

    from peer_rl.workers import fsdp  # deferred: pulls in torch

    indices = batch_indices(len(objective.examples), config.batch_size, step, config.seed)
    rows, real = rank_rows(indices, me.rank, me.world_size)
    units = objective.units(indices)
    lr = trainee.optim.param_groups[0]["lr"]
    trainee.optim.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), dtype=torch.float64)
    hits = torch.zeros((), dtype=torch.float64)
    micro = config.micro_batch_size
    for k in range(0, len(rows), micro):
        chunk = [objective.examples[i] for i in rows[k:k + micro]]
        loss, chunk_hits = objective.micro_batch(trainee.model, chunk, real[k:k + micro],
                                                 me.device)
        # share of the global mean; x world_size undoes FSDP's averaging of gradients over ranks
        (loss * (me.world_size / units)).backward()
        loss_sum += loss.detach().double().cpu()
        hits += chunk_hits
    norm, _ = fsdp.clip_and_step(trainee.model, trainee.optim, config.grad_clip, me.world_size)
    trainee.sched.step()
    summed = torch.stack([loss_sum, hits]).to(me.device)
    dist.all_reduce(summed)
    return StepResult(float(summed[0]) / units, float(summed[1]) / units, units, norm, lr)


def _log_window(config: TrainLoopConfig, me: Rank, objective, window: Window, step: int,
                lr: float, start_step: int, sink) -> dict:
    """The window's means: metrics.jsonl (rank 0), the console (rank 0, logging.verbose) and
    the record the next checkpoint is reported with."""
    done = step + 1
    last = {"step": done, "loss": window.loss / window.steps, "lr": lr,
            "grad_norm": window.grad_norm / window.steps,
            "target_tokens_per_s": window.units / max(time.perf_counter() - window.t0, 1e-9),
            "epoch": step * config.batch_size / len(objective.examples),
            "resumed_from_step": start_step, **objective.window_metrics(window)}
    if me.rank == 0 and config.verbose:
        log.info(f"step {done}/{config.total_steps} loss {last['loss']:.4f} lr {lr:.2e} "
                 f"grad_norm {last['grad_norm']:.3f} {objective.rate(last)}")
    if sink is not None:
        sink.log(done, {k: v for k, v in last.items() if k != "step"})
    return last


def _save_step(config: TrainLoopConfig, me: Rank, trainee: Trainee, done: int, last: dict,
               examples: int) -> None:
    """Collective: checkpoint step `done` into a scratch directory and report it to Ray Train,
    which copies it into <output_dir>/ray_train/run/step_N/."""
    import ray.train  # deferred: ray (~1 s); commands that start no cluster run without it
    from ray.train import Checkpoint  # deferred: ray

    tmp = Path(tempfile.mkdtemp(prefix=f"peer-rl-step{done}-"))
    try:
        state = {"step": done, "total_steps": config.total_steps, "world_size": me.world_size,
                 "examples": examples, "kind": config.kind, "loss": last.get("loss")}
        _save_checkpoint(tmp, trainee.model, trainee.optim, me.rank, config.model_path, state,
                         config.extra_files, trainee.tied, trainee.weights)
        ray.train.report({**last, "step": done}, checkpoint=Checkpoint.from_directory(str(tmp)),
                         checkpoint_dir_name=f"step_{done:06d}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
