"""FSDP2 plumbing shared by the GRPO policy group (workers/policy.py) and the supervised trainer
(workers/supervised.py): loading a checkpoint by architecture (read by rank 0 alone and
broadcast into the other ranks' shards), freezing the vision tower, sharding, full state dicts in
HF names, optimizer shards, and the non-finite-step guard.

No Ray import: both callers run it inside their own processes (Ray actors, Ray Train workers, or
plain spawned processes on a machine without Ray).

Checkpoint layout written and read here (one directory):
    model/            HF format, safetensors, fp32 master weights (rank 0), for loaders that
                      know nothing of sharding (vLLM, from_pretrained, `peer-rl eval`)
    dcp/              torch.distributed.checkpoint shards (safetensors, every rank writes its
                      slices) of the weights and the AdamW state + state.json; loadable at any
                      world size, nothing in it is unpickled
"""
from __future__ import annotations

import json
import re
import shutil
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint import (CheckpointException, HuggingFaceStorageReader,
                                          HuggingFaceStorageWriter)
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_state_dict, set_model_state_dict,
                                                     set_state_dict)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from peer_rl.compute.token_logprobs import chunked_logprobs
from peer_rl.prompts.multimodal import is_vision_language

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
FULL_STATE = StateDictOptions(full_state_dict=True, cpu_offload=True)
SHARDED_STATE = "state.json"     # beside the shards of save_sharded
# attribute paths of the vision encoder in the vision-language families we load
_VISION_TOWERS = ("model.visual", "visual", "model.vision_tower", "vision_tower", "vision_model")


def auto_class(model_path: str):
    """transformers' auto class for the checkpoint: image-text-to-text for vision-language
    models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL ...), sequence classification for scalar reward
    models (a `*ForSequenceClassification` architecture), causal LM for other text models."""
    from transformers import (AutoModelForCausalLM, AutoModelForImageTextToText,
                              AutoModelForSequenceClassification)  # deferred: transformers

    if is_vision_language(model_path):
        return AutoModelForImageTextToText
    cfg = Path(model_path) / "config.json"
    archs = json.loads(cfg.read_text(encoding="utf-8")).get("architectures") or [] \
        if cfg.exists() else []
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return AutoModelForSequenceClassification
    return AutoModelForCausalLM


def load_pretrained(model_path: str, dtype=torch.float32, attn_implementation: str | None = None):
    """The HF model at `model_path`, in eval mode (no dropout: old and new log-probs of equal
    weights agree, so the first importance ratio is exactly 1)."""
    kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return auto_class(model_path).from_pretrained(model_path, dtype=dtype, **kw).eval()


def build_empty(model_path: str, dtype=torch.float32, attn_implementation: str | None = None):
    """The module tree load_pretrained gives for `model_path` (its class, dtype, attention,
    parameter and buffer names, tied weights), built from the config alone on the meta device:
    no weight is read and no memory is taken. transformers 5 renames some families' weights at
    load (Qwen2-VL's `visual.*` -> `model.visual.*`), but only the checkpoint's names: the
    modules are the class's own either way, so the state dict keys are those of
    from_pretrained (tests/workers/test_policy.py holds them equal)."""
    from transformers import AutoConfig  # deferred: transformers (~3 s, pulls in torch)

    kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = auto_class(model_path).from_config(config, dtype=dtype, **kw)
    return model.eval()


def load_from_rank0(model_path: str, mesh, mp: MixedPrecisionPolicy, prepare=None,
                    attn_implementation: str | None = None, offload: bool = False):
    """Collective. The HF model at `model_path`, FSDP2-sharded over `mesh` (shard), with only
    rank 0 reading the checkpoint (verl's way). Why: a rank that loads the whole float32
    checkpoint before sharding holds 4 bytes a parameter at once (~32 GB for an 8B model), on
    every rank of a node, and again for the reference copy; here rank 0 holds one full copy
    while loading and every other rank only its shards (docs/internals.md, "Host memory while
    loading").

    Rank 0 loads the model (load_pretrained), the others build the same tree on the meta
    device (build_empty); every rank runs `prepare(model) -> model` on it (freezing, LoRA
    adapters, the log-prob head: whatever changes the tree or its trainable set before
    sharding), rank 0 takes its full state dict, every rank shards, and fill_from_rank0
    broadcasts rank 0's values into every rank's shards. What `prepare` initialises on rank 0
    (LoRA adapters) is broadcast with the weights, so every rank holds rank 0's values."""
    rank0 = dist.get_rank() == 0
    model = (load_pretrained if rank0 else build_empty)(
        model_path, attn_implementation=attn_implementation)
    if prepare is not None:
        model = prepare(model)
    full = model.state_dict() if rank0 else {}
    shard(model, mesh, mp, offload=offload)
    fill_from_rank0(model, full, mesh, offload=offload)
    return model


def _place_unsharded(model, device) -> None:
    """What FSDP does not shard (the vision tower's parameters, every buffer) to `device`."""
    tower = vision_tower(model)
    if tower is not None:
        tower.to(device)
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and buf.device.type != torch.device(device).type:
                module._buffers[name] = buf.to(device)


def fill_from_rank0(model, full: dict[str, torch.Tensor], mesh, offload: bool = False) -> None:
    """Collective. Fill a sharded model (shard) from rank 0's full state dict `full` ({} on the
    other ranks): torch's set_model_state_dict(broadcast_from_rank0=True) sends one tensor at a
    time and each rank keeps its slice, so no rank but 0 ever holds more than one full tensor
    of the checkpoint. A model built on the meta device gets storage for its shards first
    (to_empty). The replicated vision tower is in the state dict and arrives whole on every
    rank; a buffer that is not (rotary inv_freq) would keep whatever to_empty left in it, so
    every buffer is broadcast after, by name (the same order on every rank, which
    named_buffers does not promise after fully_shard; verl's fsdp2_load_full_state_dict sorts
    them for that reason).
    set_model_state_dict needs every tensor of the model on one device: the fill runs where
    FSDP keeps the shards (host memory under `offload`), and the tower and buffers go to the
    mesh's device after."""
    where = "cpu" if offload and mesh.device_type == "cuda" else mesh.device_type
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        model.to_empty(device=where)
    _place_unsharded(model, where)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True,
                                                               broadcast_from_rank0=True))
    _place_unsharded(model, mesh.device_type)
    for _, buf in sorted(model.named_buffers(), key=lambda item: item[0]):
        dist.broadcast(buf, src=0)


def vision_tower(model) -> torch.nn.Module | None:
    for path in _VISION_TOWERS:
        mod = model
        for part in path.split("."):
            mod = getattr(mod, part, None)
            if mod is None:
                break
        if isinstance(mod, torch.nn.Module):
            return mod
    return None


# aligner modules inside a vision tower (they project into the language model): Qwen2/2.5-VL's
# `merger`, Qwen3-VL's `merger` and `deepstack_merger_list`, LLaVA-style `*projector`
_ALIGNER = re.compile(r"(^|_)(merger|projector)(_list)?$")


def freeze_vision_tower(model) -> list[str]:
    """requires_grad_(False) on the vision encoder (the paper: "the ViT module is frozen while
    the LLM and aligner are fully fine-tuned"). An aligner (a patch merger or projector) may sit
    inside the tower but projects into the language model, so every such submodule stays
    trainable. Returns the frozen parameter names; a model without a vision tower is an error
    (the caller asked to freeze)."""
    tower = vision_tower(model)
    if tower is None:
        raise ValueError(f"{type(model).__name__} has no vision tower to freeze")
    keep = {id(p) for name, mod in tower.named_modules()
            if name and _ALIGNER.search(name.rsplit(".", 1)[-1]) for p in mod.parameters()}
    frozen_ids = set()
    for p in tower.parameters():
        if id(p) not in keep:
            p.requires_grad_(False)
            frozen_ids.add(id(p))
    return [n for n, p in model.named_parameters() if id(p) in frozen_ids]


def tied_duplicates(model) -> dict[str, str]:
    """Parameter names that alias an earlier one (a tied lm_head) -> the name they alias."""
    first, dups = {}, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            dups[name] = first[id(p)]
        first.setdefault(id(p), name)
    return dups


def mixed_precision(dtype: str) -> MixedPrecisionPolicy:
    """Compute in `dtype` (a resolved peer_rl.compute.precision dtype): bfloat16 casts each unit's
    gathered parameters for its forward and backward, while the sharded master weights, the
    optimizer and the gradient reduction stay float32; float32 casts nothing."""
    if dtype == "bfloat16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if dtype != "float32":
        raise ValueError(f"compute dtype {dtype!r}: expected float32 or bfloat16")
    return MixedPrecisionPolicy()


def settle_trainable(model) -> None:
    """FSDP2 fixes each parameter group's trainable set, and with it the dtype gradients are
    reduced in and cast back to, at the model's first forward (its lazy init). A LoRA policy's
    first forward can be the reference's, with the adapters off, and PEFT's disable_adapter
    marks them frozen while it lasts: the groups would then count no trainable parameter and,
    under bfloat16 compute, hand bfloat16 gradients to the float32 adapters (an error at the
    first backward). Initialised here, the groups see the parameters as they train."""
    model._get_fsdp_state()._lazy_init()


def decoder_layers(model) -> list[torch.nn.Module]:
    """The model's repeated blocks (its _no_split_modules) outside any vision tower, before or
    after fully_shard (which swaps each block's class for an FSDP subclass of it)."""
    tower = vision_tower(model)
    inside = {id(m) for m in tower.modules()} if tower is not None else set()
    layer_cls = set(getattr(model, "_no_split_modules", None) or [])
    return [m for m in model.modules()
            if any(c.__name__ in layer_cls for c in type(m).__mro__)
            and m is not model and id(m) not in inside]


def checkpoint_layers(model) -> int:
    """Activation checkpointing of every decoder layer: its forward runs under
    torch.utils.checkpoint (non-reentrant), so a layer keeps only its inputs and recomputes the
    rest in backward. The forward is wrapped rather than the module, so parameter names, state
    dicts and FSDP2's module hooks stay as they are, and it works in eval mode (HF's own
    gradient_checkpointing is active only in train mode, which would switch dropout on)."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.forward = partial(checkpoint, layer.forward, use_reentrant=False)
    return len(layers)


def logprob_head(model, chunk_tokens: int) -> dict:
    """Route the output layer through peer_rl.compute.token_logprobs while `ctx["labels"]` is set:
    the model's forward then returns, in place of logits, a (B, T, 2) tensor of token-aligned
    [log p(ids[t] | ids[:t]), entropy] (column 0 is 0), computed `chunk_tokens` positions at a
    time, so no full-vocabulary logits exist. The output layer's forward is replaced on the
    instance (as in checkpoint_layers), so names and state dicts stay; it runs inside the root
    module's forward, where FSDP2 holds the (tied) weight unsharded and reduces its gradient.
    Returns the context dict: `labels` (B, T-1), `temperature`, `entropy` (a mode of
    peer_rl.compute.token_logprobs); labels None gives plain logits. With `states` (U,) set as
    well (a packed row, peer_rl.compute.packing.predictions), `labels` (U,) are scored from the
    hidden states at those packed positions and the forward returns (1, U, 2)."""
    head = model.get_output_embeddings()
    plain = head.forward
    ctx = {"labels": None, "states": None, "temperature": 1.0, "entropy": "none"}

    def forward(hidden):
        if ctx["labels"] is None:
            return plain(hidden)
        if ctx["states"] is not None:
            lp, ent = chunked_logprobs(hidden[0, ctx["states"]], head.weight, head.bias,
                                       ctx["labels"], ctx["temperature"], chunk_tokens,
                                       ctx["entropy"])
            return torch.stack([lp[None], ent[None]], -1)       # (1, U, 2), not a view
        lp, ent = chunked_logprobs(hidden[:, :-1], head.weight, head.bias, ctx["labels"],
                                   ctx["temperature"], chunk_tokens, ctx["entropy"])
        return F.pad(torch.stack([lp, ent], -1), (0, 0, 1, 0))

    head.forward = forward
    return ctx


def shard(model, mesh, mp: MixedPrecisionPolicy, offload: bool = False):
    """fully_shard each decoder layer (the model's _no_split_modules), then the root, which
    holds the embeddings, the final norm and the (tied) lm_head together.

    A vision tower is left out of FSDP (`ignored_params`) and replicated on every rank. FSDP2
    all-gathers a unit's parameters when the unit runs, so every rank must run the same units in
    the same order; a rank whose micro-batch has no image skips the tower inside the model's
    forward while a rank with images runs it, and sharded tower units would leave the
    collectives unpaired. Replicated, the tower costs no collective in the forward; the
    gradients of its trainable part (the merger, or all of it when not frozen) are averaged
    over ranks by sync_replicated_grads. A ViT is small next to the language model (~0.6B of
    Qwen3-VL-8B), and frozen it has no optimizer state.
    `offload` (GPU only): FSDP2's CPUOffloadPolicy, for a model that only runs forwards (the
    frozen reference): its shards stay in host memory and are copied in per layer.
    The tower stays where it is (on the meta device for a model built there):
    fill_from_rank0 moves it to the mesh's device once it holds its values.
    """
    tower = vision_tower(model)
    ignored = set(tower.parameters()) if tower is not None else set()
    extra = {}
    if offload and mesh.device_type == "cuda":   # parameters live in host memory between uses

        extra["offload_policy"] = CPUOffloadPolicy()
    for m in decoder_layers(model):
        fully_shard(m, mesh=mesh, mp_policy=mp, **extra)
    fully_shard(model, mesh=mesh, mp_policy=mp, ignored_params=ignored or None, **extra)
    return model


def replicated_params(model) -> list[torch.nn.Parameter]:
    """Parameters FSDP does not shard (the vision tower), in a fixed order."""
    tower = vision_tower(model)
    return list(tower.parameters()) if tower is not None else []


def sync_replicated_grads(model, world_size: int) -> None:
    """Average the gradients of the trainable replicated parameters over ranks, as FSDP does
    for its own (a rank whose batch had no image holds no gradient there: it adds zeros).
    Collective: every rank calls it after the backward of each optimizer step."""
    if world_size == 1:
        return
    for p in replicated_params(model):
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad.div_(world_size)


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """Collective: every rank calls it; rank 0 gets the full (CPU) state dict, the others {}
    (torch's cpu_offload gathers to rank 0 only)."""
    return get_model_state_dict(model, options=FULL_STATE)


def to_checkpoint_names(model, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Module names -> the names the checkpoint on disk uses. transformers 5 renames some
    families at load (Qwen2-VL: `visual.*` -> `model.visual.*`, `model.layers.*` ->
    `model.language_model.layers.*`) and reverts on save; vLLM loads the on-disk names and
    silently skips any other, so every export and save goes through this."""
    from transformers.core_model_loading import revert_weight_conversion  # deferred: transformers

    return dict(revert_weight_conversion(model, dict(state_dict)))


def copy_model_files(src_dir: str | Path, dst_dir: str | Path) -> None:
    """Everything but the weights: config, generation config, tokenizer, processor, template."""
    dst = Path(dst_dir)
    dst.mkdir(parents=True, exist_ok=True)
    for f in Path(src_dir).iterdir():
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
            shutil.copy2(f, dst / f.name)


def _flat(model, msd: dict | None, osd: dict, keep=None) -> dict[str, torch.Tensor]:
    """One flat name -> tensor dict (the storage holds tensors only; a tied lm_head once);
    `keep(name)` chooses the model tensors (None: all)."""
    tied = tied_duplicates(model)
    flat = {f"model/{k}": v for k, v in (msd or {}).items()
            if k not in tied and (keep is None or keep(k))}
    flat |= {f"optim/{fqn}/{k}": v for fqn, st in osd["state"].items() for k, v in st.items()
             if torch.is_tensor(v)}
    return flat


SHARD_FILE_BYTES = 256 << 20     # a rank's bytes per checkpoint file, about


def file_index(flat: dict[str, torch.Tensor], world_size: int,
               per_rank_bytes: int) -> dict[str, int]:
    """name -> checkpoint file (1, 2, ...): consecutive tensors until a rank's slices of them
    pass ~per_rank_bytes. Why: torch's safetensors writer builds each file whole in memory
    before writing it, so one file per rank holds the rank's whole model and AdamW state again
    in passing (+1.14 GiB of RSS at ~100M on one rank; +0.25 GiB in 256 MiB files). Sized from
    global shapes, so every rank computes the same mapping, as the writer requires."""
    budget, index, size, out = per_rank_bytes * world_size, 1, 0, {}
    for name, t in flat.items():
        n = t.numel() * t.element_size()
        if size and size + n > budget:
            index, size = index + 1, 0
        out[name] = index
        size += n
    return out


def save_sharded(directory: str | Path, model, optim, rank: int, include_model: bool = True,
                 keep=None, **extra) -> None:
    """Collective. `directory`: the policy (unless include_model=False) and its AdamW state as
    torch.distributed.checkpoint shards, each rank writing its own slices in parallel, in
    safetensors files of ~SHARD_FILE_BYTES a rank (file_index) whose JSON headers carry the
    sharding (no pickle anywhere), plus `state.json` (rank 0: param groups and `extra`).
    Loadable at any world size. `keep(name)`: only these model tensors (LoRA: the adapters).
    """
    d = Path(directory)
    msd, osd = get_state_dict(model, optim)
    flat = _flat(model, msd if include_model else None, osd, keep)
    mapping = file_index(flat, dist.get_world_size() if dist.is_initialized() else 1,
                         SHARD_FILE_BYTES)
    dcp.save(flat, storage_writer=HuggingFaceStorageWriter(
        str(d), fqn_to_index_mapping=mapping, save_distributed=True))
    if rank == 0:
        groups = [{k: v for k, v in g.items()} for g in osd["param_groups"]]
        (d / SHARDED_STATE).write_text(json.dumps({"param_groups": groups, "extra": extra}),
                                       encoding="utf-8")


def _unsaved_optim_state(flat: dict, osd: dict, reader) -> tuple[dict, list[str]]:
    """`flat` less the optimizer tensors the checkpoint does not hold, and the parameters whose
    state that was. AdamW keeps no state for a parameter that never had a gradient (a
    vision-language policy trained on text alone never trains its vision tower); the load
    drops theirs after (_forget_state), so such a parameter's first step is a first step, as in
    the run that was saved. A model tensor the checkpoint lacks still fails the load."""
    saved = reader.read_metadata().state_dict_metadata
    unsaved = [f for f, st in osd["state"].items()
               if not any(f"optim/{f}/{k}" in saved for k in st)]
    return {k: v for k, v in flat.items() if not k.startswith("optim/") or k in saved}, unsaved


def _forget_state(model, optim, fqns: list[str]) -> None:
    params = dict(model.named_parameters())
    for fqn in fqns:
        optim.state.pop(params.get(fqn), None)


def load_sharded(directory: str | Path, model, optim, include_model: bool = True,
                 keep=None) -> dict:
    """Collective. Restore what save_sharded wrote, resharded to this group's world size;
    returns its `extra`. The optimizer state is built first (zeros; torch does this for an
    optimizer that has not stepped yet) so every tensor has its target shape and sharding."""
    d = Path(directory)
    meta_path = d / SHARDED_STATE
    if not meta_path.exists():
        raise FileNotFoundError(f"{d}: no {SHARDED_STATE}, so not a complete sharded checkpoint "
                                "(torch.distributed.checkpoint shards with their state file)")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    msd, osd = get_state_dict(model, optim)
    reader = HuggingFaceStorageReader(str(d))
    try:
        flat, unsaved = _unsaved_optim_state(
            _flat(model, msd if include_model else None, osd, keep), osd, reader)
        dcp.load(flat, storage_reader=reader)   # in place, into msd / osd
    except CheckpointException as exc:   # a BaseException: name the directory and the cause
        causes = "; ".join(sorted({str(e).strip().splitlines()[-1]
                                   for e in exc.failures.values()}))
        raise ValueError(f"{d}: the sharded checkpoint cannot be read: {causes}") from None
    except Exception as exc:             # its headers, read first: not safetensors, torn
        raise ValueError(f"{d}: the sharded checkpoint cannot be read: "
                         f"{type(exc).__name__}: {exc}") from None
    osd["param_groups"] = [{k: tuple(v) if k == "betas" else v for k, v in g.items()}
                           for g in meta["param_groups"]]
    if keep is not None:
        msd = {k: v for k, v in msd.items() if keep(k)}
    set_state_dict(model, optim, model_state_dict=msd if include_model else {},
                   optim_state_dict=osd,
                   options=StateDictOptions(strict=include_model and keep is None))
    _forget_state(model, optim, unsaved)
    return meta["extra"]


def clip_and_step(model, optim, grad_clip: float, world_size: int = 1) -> tuple[float, bool]:
    """Average replicated gradients, clip the global gradient norm and step, unless the norm is
    not finite (verl's guard: one bad batch must not write NaNs into the weights).
    torch's clip_grad_norm_ cannot take FSDP's sharded gradients and the replicated tower's
    plain ones together, so the norm is combined here and torch clips with it.
    Returns (norm, stepped)."""
    sync_replicated_grads(model, world_size)
    params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
    sharded = [p for p in params if isinstance(p.grad, DTensor)]
    plain = [p for p in params if not isinstance(p.grad, DTensor)]
    sq = torch.zeros((), dtype=torch.float64)
    if sharded:
        n = torch.nn.utils.get_total_norm([p.grad for p in sharded])
        sq += float(n.full_tensor() if isinstance(n, DTensor) else n) ** 2
    if plain:
        sq += float(torch.nn.utils.get_total_norm([p.grad for p in plain])) ** 2
    norm = float(sq.sqrt())
    stepped = bool(torch.isfinite(torch.tensor(norm)))
    if stepped:
        for group in (sharded, plain):   # one norm over both kinds of gradient
            if group:
                torch.nn.utils.clip_grads_with_norm_(group, grad_clip, torch.tensor(norm))
        optim.step()
    optim.zero_grad(set_to_none=True)
    return norm, stepped
