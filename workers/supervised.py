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

Loss: token-mean cross-entropy over the target tokens of the whole global batch (labels from
peer_rl.supervised.examples, -100 on prompt tokens), so world_size 1 and 2 take the same step;
with trainer.verdict_balance a weighted mean, each verdict's tokens at its class weight.
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

from peer_rl.compute.precision import cpu_has_bf16, resolve_dtype
from peer_rl.config.worker_settings import LoRASettings
from peer_rl.supervised.examples import (batch_indices, collate, count_targets, example_view,
                                         load_examples, lr_schedule, rank_rows)
from peer_rl.tracking.metrics import MetricsSink

log = logging.getLogger(__name__)

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


def lora_weights(config: dict, resume_dir: Path | None):
    """What a stage trains (peer_rl.workers.lora): full weights, or LoRA adapters of config["lora"]
    (model.lora) that a resume takes from its checkpoint's model/adapter/. A checkpoint of the
    other kind stops the resume naming the key."""
    from peer_rl.workers import lora  # deferred: pulls in torch

    settings = dict(config.get("lora") or {})
    saved = resume_dir is not None and (resume_dir / "model" / "adapter").is_dir()
    if resume_dir is not None and saved != bool(settings.get("rank")):
        what = "LoRA adapters" if saved else "full weights"
        raise ValueError(f"{resume_dir}: the checkpoint holds {what}, but {lora.KEY}.rank="
                         f"{settings.get('rank', 0)}: resume with the setting it was trained with")
    if not settings.get("rank"):
        return lora.FullWeights()
    if saved:
        settings["lora_adapter_path"] = str(resume_dir / "model" / "adapter")
    return lora.Adapters(LoRASettings(**settings), config["model_path"])


def _save_checkpoint(directory: Path, model, optim, rank: int, world_size: int, src_dir: str,
                     state: dict, extra_files: dict[str, str], drop: set[str],
                     weights=None) -> None:
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


def train_loop(config: dict) -> None:
    """Ray Train worker function (one FSDP2 rank). `config` is plain data from run_supervised."""
    import ray.train  # deferred: ray (~1 s); commands that start no cluster run without it
    import torch  # deferred: torch (~2 s); the CLI starts without it
    import torch.distributed as dist  # deferred: torch (~2 s); the CLI starts without it
    import torch.nn.functional as F  # deferred: torch (~2 s); the CLI starts without it
    from ray.train import Checkpoint  # deferred: ray
    from torch.distributed.device_mesh import init_device_mesh  # deferred: torch
    from transformers import AutoTokenizer  # deferred: transformers (~3 s, pulls in torch)

    from peer_rl.workers import fsdp  # deferred: pulls in torch

    from peer_rl.supervised.bradley_terry import bt_loss, collate_pairs, load_pairs  # deferred: pulls in torch

    verbose = config.get("verbose", True)
    if not verbose:      # the driver draws the progress from metrics.jsonl (StepBar)
        _quiet_train_reports()

    ctx = ray.train.get_context()
    rank, ws = ctx.get_world_rank(), ctx.get_world_size()
    use_cuda = torch.cuda.is_available() and config["use_gpu"]
    if use_cuda:
        import ray.train.torch as rtt  # deferred: ray
        device = rtt.get_device()
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, int(config["cpus_per_worker"])))
    if not dist.is_initialized():   # world_size 1 still goes through the same code path
        raise RuntimeError("Ray Train did not set up torch.distributed")
    mesh = init_device_mesh(device.type, (ws,))
    torch.manual_seed(config["seed"])

    # ---- data: every rank tokenizes the same files (deterministic) and takes its rows per step
    tokenizer = AutoTokenizer.from_pretrained(config["model_path"])
    bt = config["kind"] == "bt"      # pairs + Bradley-Terry loss; else token cross-entropy
    vision = None if bt else vision_inputs(config["model_path"])
    if bt:
        examples, _ = load_pairs(config["data_root"], config["train_files"], tokenizer,
                                 config["max_length"], config["skip_invalid"], config["max_rows"])
    else:
        examples, _ = load_examples(config["data_root"], config["train_files"], tokenizer,
                                    config["max_length"], config["skip_invalid"],
                                    config["max_rows"], image_tokens=image_token_counter(vision),
                                    languages=config["languages"],
                                    verdict_balance=config.get("verdict_balance", False),
                                    **example_view(config["kind"], config["extra_files"]))
    n, bs, micro, total = len(examples), config["batch_size"], config["micro_batch_size"], config["total_steps"]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    # ---- model: from the newest checkpoint (resume) or from model_path
    start_step, src = 0, config["model_path"]
    ckpt = ray.train.get_checkpoint()
    ckpt_dir = None
    if ckpt is not None:
        ckpt_dir = Path(ckpt.path) if ckpt.filesystem.type_name == "local" else None
        if ckpt_dir is None:                    # remote storage: download once per rank
            ckpt_dir = Path(ckpt.to_directory(tempfile.mkdtemp(prefix="peer-rl-ckpt-")))
        state = json.loads((ckpt_dir / STATE_FILE).read_text(encoding="utf-8"))
        start_step, src = int(state["step"]), str(ckpt_dir / "model")
    weights = lora_weights(config, ckpt_dir)
    if weights.on:               # the base from model_path, the adapters from the checkpoint
        src = config["model_path"]
    dtype = resolve_dtype(config.get("dtype", "auto"), use_cuda, cpu_has_bf16(), "trainer.dtype")
    mp = fsdp.mixed_precision(dtype)
    tied: set[str] = set()

    def prepare(model):               # every rank, before sharding (rank 0: the weights)
        model = _prepare_model(model, config["gradient_checkpointing"],
                               config["freeze_vision_tower"])
        tied.update(fsdp.tied_duplicates(model))
        model = weights.wrap(model)  # LoRA: adapters injected, every base weight frozen
        if weights.on and config["gradient_checkpointing"]:
            # recomputed layers need an input that requires grad, or the frozen embeddings cut
            # the adapters' gradient
            model.enable_input_require_grads()
        return model

    # rank 0 reads the checkpoint on the host; every rank gets its shards by broadcast, on the
    # mesh's device (fsdp.load_from_rank0)
    model = fsdp.load_from_rank0(src, mesh, mp, prepare)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                              lr=config["lr"], weight_decay=config["weight_decay"])
    if ckpt_dir is not None:
        fsdp.load_sharded(ckpt_dir / "optim", model, optim, include_model=False)
        if rank == 0:
            log.info(f"resumed from {ckpt_dir.name} (step {start_step}/{total})")
    if rank == 0 and verbose:
        log.info(f"{ws} rank(s), {dist.get_backend()} on {device.type}, {dtype} compute; "
                 f"{n} examples; steps {start_step + 1}..{total}")

    sink = None       # rank 0 writes metrics.jsonl (and TensorBoard), as the RL runs do
    if rank == 0:
        Path(config["output_dir"]).mkdir(parents=True, exist_ok=True)
        sink = MetricsSink(Path(config["output_dir"]), ["jsonl", "tensorboard"],
                           resume_step=start_step if ckpt_dir is not None else None)
    sched = lr_schedule(optim, config["lr"], total, config["warmup_steps"],
                        config["lr_scheduler"], config["min_lr_ratio"], start_step)

    window = {"loss": 0.0, "tokens": 0.0, "steps": 0, "grad_norm": 0.0, "t0": time.perf_counter()}
    last: dict = {}
    for step in range(start_step, total):
        idx = batch_indices(n, bs, step, config["seed"])
        rows, real = rank_rows(idx, rank, ws)
        # the loss is a mean over the global batch: target tokens (sft, rm) or pairs (bt)
        global_tokens = len(idx) if bt else max(1, sum(count_targets(examples[i]) for i in idx))
        lr = optim.param_groups[0]["lr"]
        optim.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64)
        right = torch.zeros((), dtype=torch.float64)       # bt: pairs scored the right way
        for k in range(0, len(rows), micro):
            chunk = [examples[i] for i in rows[k:k + micro]]
            if bt:
                ok = torch.tensor(real[k:k + micro], dtype=torch.float32, device=device)
                batch = {key: v.to(device) for key, v in collate_pairs(chunk, pad_id).items()}
                scores = model(**batch, use_cache=False).logits[:, 0].float()
                margin = scores[:len(chunk)] - scores[len(chunk):]
                # the chunk's pairs summed; rank padding pairs weigh 0
                nll = bt_loss(scores[:len(chunk)], scores[len(chunk):], ok, reduction="sum")
                (nll * (ws / global_tokens)).backward()
                loss_sum += nll.detach().double().cpu()
                right += (((margin > 0).float() + 0.5 * (margin == 0).float()) * ok).sum() \
                    .detach().double().cpu()
                continue
            batch = collate(chunk, pad_id, real[k:k + micro])
            extra = {}
            if vision is not None:     # the frames of visual rows (peer_rl.workers.vision)
                extra = vision(batch["input_ids"], [e["images"] for e in chunk])
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
            # share of the global token-mean; x ws undoes FSDP's averaging of gradients over ranks
            (ce * (ws / global_tokens)).backward()
            loss_sum += ce.detach().double().cpu()
        norm, _ = fsdp.clip_and_step(model, optim, config["grad_clip"], ws)
        sched.step()
        red = torch.stack([loss_sum, right]).to(device)
        dist.all_reduce(red)
        loss = float(red[0]) / global_tokens
        window["acc"] = window.get("acc", 0.0) + float(red[1]) / global_tokens
        window["loss"] += loss
        window["tokens"] += global_tokens
        window["steps"] += 1
        window["grad_norm"] += norm
        done = step + 1
        is_save = done == total or (config["save_freq"] and done % config["save_freq"] == 0)
        if done % config["log_freq"] == 0 or is_save or done == start_step + 1:
            dt = time.perf_counter() - window["t0"]
            last = {"step": done, "loss": window["loss"] / window["steps"], "lr": lr,
                    "grad_norm": window["grad_norm"] / window["steps"],
                    "target_tokens_per_s": window["tokens"] / max(dt, 1e-9),
                    "epoch": step * bs / n, "resumed_from_step": start_step}
            if bt:   # tokens/s means pairs/s here; the train pairwise accuracy of the window
                last["pairwise_accuracy"] = window.get("acc", 0.0) / window["steps"]
            if rank == 0 and verbose:
                rate = (f"{last['target_tokens_per_s']:.1f} pairs/s train acc "
                        f"{last['pairwise_accuracy']:.3f}" if bt else
                        f"{last['target_tokens_per_s']:.0f} target tok/s")
                log.info(f"step {done}/{total} loss {last['loss']:.4f} lr {lr:.2e} "
                         f"grad_norm {last['grad_norm']:.3f} {rate}")
            if rank == 0:
                sink.log(done, {k: v for k, v in last.items() if k != "step"})
            window = {"loss": 0.0, "tokens": 0.0, "steps": 0, "grad_norm": 0.0, "acc": 0.0,
                      "t0": time.perf_counter()}
        if is_save:
            tmp = Path(tempfile.mkdtemp(prefix=f"peer-rl-step{done}-"))
            try:
                state = {"step": done, "total_steps": total, "world_size": ws, "examples": n,
                         "kind": config["kind"], "loss": last.get("loss")}
                _save_checkpoint(tmp, model, optim, rank, ws, config["model_path"], state,
                                 config["extra_files"], tied, weights)
                ray.train.report({**last, "step": done}, checkpoint=Checkpoint.from_directory(str(tmp)),
                                 checkpoint_dir_name=f"step_{done:06d}")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    if sink is not None:
        sink.close()
