"""One rank of the FSDP2 policy group (step 7 of the controller): old/ref log-probs and the GRPO update.

A plain class, no Ray import: the placement layer wraps it (`ray.remote(num_cpus=1)(PolicyWorker)`)
and the GPU machine, which has no Ray, can drive it directly. Every rank receives the SAME full
batch and shards it itself, so the controller just broadcasts one object reference.

Conventions
- Batches are peer_rl.protocol.UpdateBatch: right-padded prompt + response rows, the response
  mask, advantages; optionally old and reference log-probs (recomputation skipped) and the
  sampler's (async training). Settings are peer_rl.config.worker_settings.PolicySettings.
- pi_old, the clipped ratio's anchor, is given, recomputed or the training forward's own
  (verl's on_policy): OldLogProbs says which and when. The update's figures are summed by name
  (peer_rl.workers.update_sums) and all-reduced once.
- Log-probs are returned token-aligned, (N, T): column t is log p(input_ids[t] | input_ids[:t]),
  i.e. it comes from the logits at position t-1 (column 0 has no prediction and is 0; padding is
  0). This lines up with `response_mask` and with the sampler's per-token log-probs.
- Mini-batches are drawn from one seeded permutation of the GLOBAL batch (the same on every rank),
  each rank takes rows rank::world_size of a mini-batch, and the loss of a micro-batch is scaled
  so that the accumulated, FSDP-averaged gradient is the token-mean over the whole global
  mini-batch. Hence world_size 1 and world_size 2 produce the same weights (tested to 1e-5).
  Ranks with fewer rows run zero-weight padding rows so all ranks issue the same collectives.
"""
from __future__ import annotations

import datetime
import enum
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from peer_rl.algos import (
    agg_loss,
    entropy_from_logits,
    get_policy_loss_fn,
    kl_penalty,
    logprobs_from_logits,
)
from peer_rl.compute import packing, precision, shared_prefix
from peer_rl.compute.activation_memory import (GiB, choose_recomputation, fitted_token_budget,
                                               stored_activation_bytes, trained_for,
                                               training_state_bytes)
from peer_rl.compute.kv_cache import max_positions, read_config
from peer_rl.compute.micro_batches import by_count, by_token_budget, by_units
from peer_rl.files.durable import fsync_tree
from peer_rl.tracking.metrics import peak_rss_bytes
from peer_rl.protocol import Dispatch, LogProbs, UpdateBatch, dispatch
from peer_rl.config.worker_settings import LoRASettings, PolicySettings, shared_prefix_on
from peer_rl.models.local import on_this_node
from peer_rl.workers import devices, fsdp, lora, weight_sync
from peer_rl.workers.update_sums import UpdateSums
from peer_rl.workers.vision import VisionInputs


def _tensor(x, dtype=None) -> torch.Tensor:
    """Copy (Ray hands over read-only numpy views, which torch.as_tensor warns about)."""
    t = x.detach().clone() if torch.is_tensor(x) else torch.tensor(np.asarray(x))
    return t if dtype is None else t.to(dtype)


class OldLogProbs(enum.Enum):
    """Where an update's pi_old, the anchor of the clipped ratio, comes from."""

    GIVEN = "given"            # the batch carries old and reference log-probs: no no-grad pass
    RECOMPUTED = "recomputed"  # a no-grad pass of the policy over the batch before training
    # verl's on_policy: one optimizer step on the whole batch (ppo_epochs 1, one mini-batch) and
    # no behaviour weights, so pi_old is the policy as it stands: each training forward's own
    # log-probs, detached; only the reference's no-grad pass runs
    ON_POLICY = "on_policy"


@dataclass
class _UpdateInputs:
    """One update's batch as CPU tensors, every rank holding all of it."""

    ids: torch.Tensor                 # (N, T) right-padded prompt + response
    attn: torch.Tensor
    mask: torch.Tensor                # response tokens that carry a prediction (float)
    adv: torch.Tensor                 # (N,)
    temperature: float
    images: list[list[str]] | None    # per row: the frames the engine saw
    source: OldLogProbs
    old: torch.Tensor | None          # None when ON_POLICY
    ref: torch.Tensor
    behavior_w: torch.Tensor | None   # pi_old / pi_behavior, capped; None without
    behavior_metrics: dict
    share: torch.Tensor               # (N,) tokens each row may share: its prompt
    unit_ids: torch.Tensor            # (N,) a group's rows share an id (shared_prefix.units)
    units: _Units | None              # those units, when prefixes are shared


def _classes(images, rows=None) -> list | None:
    """The rows' image lists as classes of shared_prefix (rows share only with rows showing
    the same images); None without images."""
    if images is None:
        return None
    return [tuple(images[int(i)]) for i in (range(len(images)) if rows is None else rows)]


@dataclass(frozen=True)
class _Units:
    """A group's rows (peer_rl.compute.shared_prefix.units), kept together so that the prefix
    they share runs once: a unit id per row, the tokens a row saves beside another row of its
    unit (shared_prefix.unit_prefixes), each row's tokens."""
    unit: torch.Tensor
    prefix: torch.Tensor
    lengths: torch.Tensor


class PolicyWorker:
    """FSDP2-sharded trainable policy plus a frozen FSDP2-sharded reference, on one rank; with
    model.lora.rank > 0 only LoRA adapters train and the reference is the policy with its
    adapters off, no copy (peer_rl.workers.lora: what trains and where the reference comes from).

    The reference is sharded like the policy rather than kept as a full copy per rank: a full
    fp32 copy of an 8B model is 32 GB on every rank, sharding divides it by world_size, and it
    reuses the same collectives. It is loaded from `model_path` and never changes, also across
    checkpoint resumes (GRPO's KL anchor is the initial policy). Dropout stays off (eval mode) in
    both, so old and new log-probs of identical weights agree and the first ratio is exactly 1.
    Only rank 0 reads the checkpoint; the other ranks build both models on the meta device and
    receive their shards by broadcast (fsdp.load_from_rank0), so a rank other than 0 never holds
    the full model in host memory (docs/internals.md, "Host memory while loading").
    """

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int,
                 model_path: str, settings: PolicySettings | None = None, *, rollout_n: int = 1,
                 seed: int = 0, backend: str | None = None, max_row_len: int = 0,
                 lora_settings: LoRASettings | None = None):
        """`rollout_n`: rows each prompt brings, so that a mini-batch of
        settings.ppo_mini_batch_size prompts is that many times as many rows (verl's
        normalisation); 1 where the rows are not groups. `max_row_len`: the longest row a batch
        can hold (prompt + reply, the rollout's max_model_len; 0 = the token budget), which
        sizes a micro-batch for gradient_checkpointing=auto when there is no token budget.
        `lora_settings`: model.lora (rank 0 or None = full weights; peer_rl.workers.lora)."""
        s = self.settings = settings or PolicySettings()
        self.rank, self.world_size = rank, world_size
        self.model_path = model_path = on_this_node(model_path)
        self.weights = lora.policy_weights(lora_settings, model_path)
        self.master_addr, self.seed = master_addr, seed
        self.mini = s.ppo_mini_batch_size * rollout_n
        self.policy_loss = get_policy_loss_fn(s.policy_loss.loss_mode)
        self.loss_agg_mode = s.loss_agg_mode
        self.clip = {"clip_ratio": s.clip_ratio, "clip_ratio_low": s.clip_ratio_low,
                     "clip_ratio_high": s.clip_ratio_high, "clip_ratio_c": s.clip_ratio_c}
        self.global_step = 0
        self.backend = backend or ("nccl" if devices.use_cuda() else "gloo")
        if self.backend == "nccl":
            local = int(os.environ.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count())))
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
        else:
            self.device = torch.device("cpu")

        # the FSDP group's rendezvous, bound to the node's address (weight_sync.make_store)
        store = weight_sync.make_store(master_addr, master_port, world_size, rank,
                                       timeout_s=30 * 60)
        dist.init_process_group(self.backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(minutes=30))
        self.mesh = init_device_mesh(self.device.type, (world_size,))
        torch.manual_seed(seed)

        gpu = self.device.type == "cuda"
        self.dtype = precision.resolve_dtype(s.dtype, gpu, not gpu and precision.cpu_has_bf16(),
                                             "actor.dtype")
        dtype_line = "compute " + precision.dtype_line(s.dtype, self.dtype, gpu)
        mp = fsdp.mixed_precision(self.dtype)
        self.vision = None
        if fsdp.is_vision_language(model_path):
            self.vision = VisionInputs(model_path)
        self.share_prefix = shared_prefix_on(s.shared_prefix, s.use_remove_padding)
        self.forward_tokens = 0               # tokens the forwards ran (a shared prefix once)
        self.frozen: set[str] = set()         # HF names of frozen (vision tower) parameters
        self._heads: dict[int, dict] = {}     # id(model) -> its logprob_head context
        self.model = self._load_sharded(mp, trainable=True)
        self.ref, ref_line = self.weights.reference(
            lambda: self._load_sharded(mp, offload=s.ref_param_offload).requires_grad_(False),
            world_size)
        if self.weights.on:                   # the reference runs the policy's own output layer
            self._heads[id(self.ref)] = self._heads.get(id(self.model))
        self.token_budget, budget_line = self._fit_token_budget()
        self.recompute, self.recompute_line = self._choose_recomputation(max_row_len)
        loaded = f"{peak_rss_bytes() / 2**30:.2f} GiB resident at most while loading"
        self.recompute_line = "; ".join(x for x in (ref_line, budget_line, self.recompute_line,
                                                    dtype_line, loaded) if x)
        if self.recompute:      # the forward is wrapped on the instance: sharding is unaffected
            fsdp.checkpoint_layers(self.model)
        fsdp.settle_trainable(self.model)
        # frozen parameters get no gradient and no optimizer state
        self.optim = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad],
                                       lr=s.lr, weight_decay=s.weight_decay)

    # ------------------------------------------------------------------ model plumbing
    def _load_sharded(self, mp, trainable: bool = False, offload: bool = False) -> torch.nn.Module:
        """HF model (by architecture), read by rank 0 alone and broadcast into every rank's
        shards (fsdp.load_from_rank0: fully_shard each block, then the root); the output layer
        routed through chunked log-probs unless actor.logits_chunk_size=0."""
        attn = packing.register() if self.settings.use_remove_padding else None

        def prepare(model):                   # every rank, before sharding (rank 0: the weights)
            if not hasattr(self, "hf_keys"):
                self.hf_keys = list(model.state_dict())  # from_pretrained(...).state_dict()'s keys
                self.tied = fsdp.tied_duplicates(model)  # duplicate -> source key
            if trainable and self.settings.freeze_vision_tower and self.vision is not None:
                self.frozen = set(fsdp.freeze_vision_tower(model))   # text-only models: no-op
            if trainable:
                model = self.weights.wrap(model)  # LoRA: adapters injected, the base frozen
            if self.settings.logits_chunk_size > 0:
                self._heads[id(model)] = fsdp.logprob_head(model, self.settings.logits_chunk_size)
            return model

        return fsdp.load_from_rank0(self.model_path, self.mesh, mp, prepare,
                                    attn_implementation=attn, offload=offload)

    def _trained(self):
        """What the training forward computes in and what trains (activation estimates)."""
        return trained_for(precision.BYTES[self.dtype], getattr(self.weights, "settings", None))

    def _fit_token_budget(self) -> tuple[int, str]:
        """actor.ppo_max_token_len_per_gpu, lowered under actor.micro_batch_activation_gib
        (peer_rl.compute.activation_memory.fitted_token_budget); the start-up line where it was."""
        s = self.settings
        budget = s.ppo_max_token_len_per_gpu
        if not (budget and s.micro_batch_activation_gib):
            return budget, ""
        config, trained = read_config(self.model_path), self._trained()
        fitted = fitted_token_budget(config, budget, s.micro_batch_activation_gib * GiB, trained)
        if fitted == budget:
            return budget, ""

        def kept(tokens: int) -> float:
            return stored_activation_bytes(config, tokens, trained) / GiB

        return fitted, (f"token budget {fitted} (actor.micro_batch_activation_gib="
                        f"{s.micro_batch_activation_gib:g}: ~{kept(fitted):.2f} GiB of activations "
                        f"a micro-batch; {budget} would keep ~{kept(budget):.2f} GiB)")

    def _choose_recomputation(self, max_row_len: int) -> tuple[bool, str]:
        """actor.gradient_checkpointing: true / false as set; auto from the estimated activations
        of a forward at the token budget against this node's free memory over its ranks, read
        now that both models are loaded (peer_rl.compute.activation_memory). One answer for all ranks:
        recomputation wherever any rank needs it."""
        s = self.settings
        config = read_config(self.model_path)
        row = min(max_row_len or self.token_budget or 4096, max_positions(config))
        tokens = self.token_budget or s.ppo_micro_batch_size * row
        gpu = self.device.type == "cuda"
        activations = stored_activation_bytes(config, tokens, self._trained())
        shard = sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                    for p in self.model.parameters() if p.requires_grad)
        if gpu:
            available, local = torch.cuda.mem_get_info(self.device)[0], 1
        else:
            hosts = [None] * self.world_size
            dist.all_gather_object(hosts, socket.gethostname())
            available, local = psutil.virtual_memory().available, hosts.count(socket.gethostname())
        on, line = choose_recomputation(str(s.gradient_checkpointing).lower(), activations,
                                        training_state_bytes(shard), available, local)
        flag = torch.tensor([int(on)], device=self.device)
        if self.world_size > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if bool(flag.item()) != on:
            line += "; on, as another rank needs it"
        return bool(flag.item()), line

    def recomputation(self) -> dict:
        """Whether this rank recomputes activations, its compute dtype, and the start-up line
        saying how each was chosen (the token budget too where
        actor.micro_batch_activation_gib lowered it)."""
        return {"on": self.recompute, "dtype": self.dtype, "line": self.recompute_line}

    def _vision_kwargs(self, ids: torch.Tensor, images, rows: torch.Tensor) -> dict:
        """pixel values, grids and image-token types of `rows` (peer_rl.workers.vision); {} if none."""
        if self.vision is None or images is None:
            return {}
        kw = self.vision(ids, [list(images[int(i)]) for i in rows])
        return {k: v.to(self.device) for k, v in kw.items()}

    def _token_logp(self, model, ids, attn, temperature: float, entropy: bool = False,
                    vision: dict | None = None, share: torch.Tensor | None = None,
                    classes: list | None = None):
        """Token-aligned log-probs (B, T): logits at t-1 score token t; optional entropy (B, T),
        with a gradient only when actor.entropy_coeff is set (else a metric).
        actor.use_remove_padding: the rows run packed into one (peer_rl.compute.packing), no
        padding; with `share` (B,) (each row's prompt length) under actor.shared_prefix, rows
        that begin alike (and whose `classes`, their images, are equal) run their common start
        once (peer_rl.compute.shared_prefix), an image in it encoded once."""
        vision = vision or {}
        if not self.settings.use_remove_padding:
            self.forward_tokens += ids.numel()
            return self._aligned_logp(model, dict(input_ids=ids, attention_mask=attn, **vision),
                                      temperature, entropy)
        if share is not None and self.share_prefix:
            lay, _ = shared_prefix.layout(ids, attn, share.tolist(), classes)
        else:
            lay = packing.layout(attn)
        self.forward_tokens += lay.tokens
        pred = packing.predictions(ids, lay)
        inputs = {k: packing.pack(v, lay) if k == "mm_token_type_ids" else v
                  for k, v in self._packed_vision(vision, ids, lay).items()}
        inputs.update(input_ids=packing.pack(ids, lay),
                      position_ids=packing.position_ids(model, ids, attn, lay, vision))
        logp, ent = self._pair_logp(model, inputs, pred, temperature, entropy)
        return packing.scatter(logp, pred), (None if ent is None else packing.scatter(ent, pred))

    def _packed_vision(self, vision: dict, ids: torch.Tensor, lay: packing.Layout) -> dict:
        """`vision` with the pixels and grids of the images the packed row holds, in its order
        (an image in a shared prefix once); the grids of all of them still place the
        positions (packing.position_ids)."""
        if not vision:
            return vision
        grids = vision["image_grid_thw"]
        patches = grids.prod(1).tolist()
        keep = packing.packed_images(lay, ids, self.vision.image_token_id,
                                     [p // self.vision.merge ** 2 for p in patches])
        if keep == list(range(len(patches))):
            return vision
        starts = np.cumsum([0, *patches])
        pixels = torch.cat([vision["pixel_values"][starts[k]:starts[k + 1]] for k in keep])
        return {**vision, "pixel_values": pixels, "image_grid_thw": grids[keep]}

    def _entropy_mode(self, entropy: bool) -> str:
        return ("grad" if self.settings.entropy_coeff else "metric") if entropy else "none"

    def _pair_logp(self, model, inputs: dict, pred: packing.Predictions, temperature: float,
                   entropy: bool):
        """(U,) log-probs (and entropies) of a packed row's (state, label) pairs."""
        mode = self._entropy_mode(entropy)
        states, labels = pred.states.to(self.device), pred.labels.to(self.device)
        head = self._heads.get(id(model))
        if head is not None:                  # chunked: no full-vocabulary logits anywhere
            head.update(labels=labels, states=states, temperature=temperature, entropy=mode)
            try:
                out = model(**inputs, use_cache=False).logits[0]
            finally:
                head.update(labels=None, states=None)
            return out[:, 0], (out[:, 1] if entropy else None)
        logits = model(**inputs, use_cache=False).logits[0, states]
        if temperature != 1.0:
            logits = logits / temperature
        logp = logprobs_from_logits(logits, labels)
        if not entropy:
            return logp, None
        if self.settings.entropy_coeff:
            return logp, entropy_from_logits(logits)
        with torch.no_grad():                 # metric only: keep the (U, V) graph small
            return logp, entropy_from_logits(logits)

    def _aligned_logp(self, model, inputs: dict, temperature: float, entropy: bool):
        """_token_logp over right-padded rows (actor.use_remove_padding=false)."""
        mode = self._entropy_mode(entropy)
        ids = inputs["input_ids"]
        head = self._heads.get(id(model))
        if head is not None:                  # chunked: no full-vocabulary logits anywhere
            head.update(labels=ids[:, 1:], temperature=temperature, entropy=mode)
            try:
                out = model(**inputs, use_cache=False).logits
            finally:
                head["labels"] = None
            return out[..., 0], (out[..., 1] if entropy else None)
        logits = model(**inputs, use_cache=False).logits[:, :-1]
        if temperature != 1.0:
            logits = logits / temperature
        logp = F.pad(logprobs_from_logits(logits, ids[:, 1:]), (1, 0))
        if not entropy:
            return logp, None
        if self.settings.entropy_coeff:
            return logp, F.pad(entropy_from_logits(logits), (1, 0))
        with torch.no_grad():                 # metric only: keep the (B, T, V) graph small
            return logp, F.pad(entropy_from_logits(logits), (1, 0))

    def _micro_batches(self, rows: torch.Tensor, attn: torch.Tensor,
                       units: _Units | None = None) -> list[torch.Tensor]:
        """Positions into `rows` (this rank's rows of a mini-batch), one tensor per forward:
        by token budget (actor.ppo_max_token_len_per_gpu as fitted, self.token_budget; the count
        agreed over ranks, since each forward all-gathers) or by actor.ppo_micro_batch_size when
        the budget is 0. With `units` (shared prefixes) a unit's rows stay together and its
        prompt counts once against the budget."""
        budget = self.token_budget
        if not budget:
            groups = by_count(len(rows), self.settings.ppo_micro_batch_size)
        else:
            lengths = attn[rows].sum(1).tolist()
            padded = not self.settings.use_remove_padding
            if units is not None:
                unit, prefix = units.unit[rows].tolist(), units.prefix[rows].tolist()

                def cut(n=None):
                    return by_units(lengths, unit, prefix, budget, n)
            else:
                def cut(n=None):
                    return by_token_budget(lengths, budget, n, padded=padded)
            n = torch.tensor([len(cut())], device=self.device)
            if self.world_size > 1:
                dist.all_reduce(n, op=dist.ReduceOp.MAX)
            groups = cut(int(n))
        return [torch.tensor(g, dtype=torch.long) for g in groups]

    def _assign(self, rows: torch.Tensor, units: _Units | None = None) -> list[torch.Tensor]:
        """Each rank's rows of `rows`: rows[rank::world_size], or with `units` consecutive runs
        of the rows ordered unit by unit (a unit split over two ranks at most), as many rows
        a rank as rows[rank::world_size] gives."""
        if units is None or self.world_size == 1:
            return [rows[r::self.world_size] for r in range(self.world_size)]
        order = rows[torch.sort(units.unit[rows], stable=True).indices]
        sizes = [len(range(r, len(rows), self.world_size)) for r in range(self.world_size)]
        return list(torch.split(order, sizes))

    def _shard_rows(self, rows: torch.Tensor, units: _Units | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of `rows` (_assign), padded (with its first row, or rows[0], at
        weight 0) to as many rows as the rank with the most (so every rank runs as many
        forwards)."""
        parts = self._assign(rows, units)
        mine = parts[self.rank]
        pad = max(len(p) for p in parts) - len(mine)
        weight = torch.cat([torch.ones(len(mine)), torch.zeros(pad)])
        fill = mine[:1] if len(mine) else rows[:1]
        return torch.cat([mine, fill.expand(pad)]), weight

    def _gather_rows(self, local: torch.Tensor, n: int,
                     parts: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Inverse of _shard_rows over the whole batch (`parts`: _assign's answer, by default
        rows r::world_size): all ranks get the full (n, ...) tensor."""
        parts = parts if parts is not None else self._assign(torch.arange(n))
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local.contiguous())
        full = torch.empty((n, *local.shape[1:]), dtype=local.dtype)
        for rows, part in zip(parts, gathered):
            full[rows] = part[:len(rows)].cpu()
        return full

    @torch.no_grad()
    def _log_probs(self, ids, attn, share, temperature, images=None, models=None, groups=None):
        """(old, ref) token-aligned log-probs of the full batch (or of `models`), each rank
        computing its shard; each micro-batch is cut to its own longest row (rows are
        right-padded)."""
        n = len(ids)
        units = self._units(attn, ids, share, images, groups)
        parts = self._assign(torch.arange(n), units)
        rows, _ = self._shard_rows(torch.arange(n), units)
        groups = self._micro_batches(rows, attn, units)
        out = []
        for model in models or (self.model, self.ref):
            local = torch.zeros((len(rows), ids.shape[1]), dtype=torch.float32, device=self.device)
            for pos in groups:
                r = rows[pos]
                L = int(attn[r].sum(1).max())
                lp = self._token_logp(model, ids[r, :L].to(self.device), attn[r, :L].to(self.device),
                                      temperature,
                                      vision=self._vision_kwargs(ids[r, :L], images, r),
                                      share=share[r], classes=_classes(images, r))[0]
                local[pos.to(self.device), :L] = lp.float()
            out.append(self._gather_rows(local, n, parts) * attn)
        return out

    def _units(self, attn: torch.Tensor, ids: torch.Tensor, share: torch.Tensor,
               images=None, groups=None, unit: torch.Tensor | None = None) -> _Units | None:
        """The batch's units (a group's rows, shared_prefix.units; `unit`: their ids if already
        known) when prefixes are shared, else None."""
        if not self.share_prefix:
            return None
        if unit is None:
            unit = shared_prefix.units(ids, share, _classes(images), groups)
        lengths = attn.sum(1)
        return _Units(unit, shared_prefix.unit_prefixes(ids, share, lengths, unit), lengths)

    # ------------------------------------------------------------------ public API
    @dispatch(Dispatch.ALL)
    def compute_log_prob(self, batch: UpdateBatch) -> LogProbs:
        """Current-policy and reference log-probs, (N, T) float32 numpy, token-aligned."""
        ids, attn = _tensor(batch.input_ids, torch.long), _tensor(batch.attention_mask, torch.long)
        share = shared_prefix.prompt_lengths(_tensor(batch.response_mask), attn)
        old, ref = self._log_probs(ids, attn, share, float(batch.temperature), batch.images,
                                   groups=batch.group_ids)
        return LogProbs(old.numpy(), ref.numpy())

    def _staleness(self, batch: UpdateBatch) -> dict:
        """The bound of trainer.async_training, checked where it matters: every sample's policy
        version (stamped by the engine that drew it) against this policy's own update count."""
        if batch.policy_versions is None:
            return {}
        lag = self.global_step - np.asarray(batch.policy_versions, dtype=np.int64)
        bound = int(batch.max_staleness)
        if lag.min() < 0 or lag.max() > bound:
            raise ValueError(f"update {self.global_step + 1}: samples drawn by policy versions "
                             f"{sorted(set((self.global_step - lag).tolist()))}, but this policy "
                             f"has {self.global_step} update(s) and the staleness bound is {bound}")
        return {"async/staleness_max": float(lag.max()), "async/staleness_mean": float(lag.mean())}

    def _behavior_weight(self, batch: UpdateBatch, old: torch.Tensor, mask: torch.Tensor):
        """Decoupled PPO's importance weight pi_old / pi_behavior per token, capped at
        actor.behavior_weight_cap; None without the sampler's log-probs or with cap 0."""
        if batch.behavior_log_probs is None or not self.settings.behavior_weight_cap:
            return None, {}
        behav = _tensor(batch.behavior_log_probs, torch.float32)
        log_w = ((old - behav) * mask).clamp(-20.0, 20.0)
        cap = self.settings.behavior_weight_cap
        w = log_w.exp().clamp(max=cap)
        tokens = mask.sum().clamp_min(1.0)
        return w, {"async/behavior_weight_mean": float((w * mask).sum() / tokens),
                   "async/behavior_weight_capped": float(((log_w.exp() > cap).float() * mask)
                                                         .sum() / tokens),
                   "async/behavior_abs_log_ratio": float((log_w.abs() * mask).sum() / tokens)}

    @dispatch(Dispatch.ALL)
    def update(self, batch: UpdateBatch) -> dict:
        """ppo_epochs x seeded mini-batches of clipped loss + KL - entropy; one step per mini-batch."""
        t0 = time.perf_counter()
        self.forward_tokens = 0
        async_metrics = self._staleness(batch)
        image_s0 = self._image_seconds()
        x = self._update_inputs(batch)
        t1 = time.perf_counter()
        sums, grad_norms, skipped, steps = self._train(x)
        self.global_step += 1
        t2 = time.perf_counter()
        sums += UpdateSums(old_ref_log_prob_s=t1 - t0, update_actor_s=t2 - t1,
                           update_total_s=t2 - t0, forward_tokens=float(self.forward_tokens),
                           image_preprocess_s=self._image_seconds() - image_s0)
        metrics = sums.all_reduce(self.device).metrics(steps, self.world_size)
        return {**metrics, **self._step_metrics(grad_norms, skipped), **async_metrics,
                **x.behavior_metrics}

    def _image_seconds(self) -> float:
        """Seconds this rank has spent preprocessing images so far (0 for a text-only model)."""
        return self.vision.seconds if self.vision is not None else 0.0

    def _old_log_prob_source(self, batch: UpdateBatch) -> OldLogProbs:
        """Where this update's pi_old comes from (OldLogProbs)."""
        if batch.old_log_probs is not None and batch.ref_log_prob is not None:
            return OldLogProbs.GIVEN
        behavior = batch.behavior_log_probs is not None and bool(self.settings.behavior_weight_cap)
        if self.settings.ppo_epochs == 1 and len(batch.input_ids) <= self.mini and not behavior:
            return OldLogProbs.ON_POLICY
        return OldLogProbs.RECOMPUTED

    def _update_inputs(self, batch: UpdateBatch) -> _UpdateInputs:
        """The batch as CPU tensors, with old (per its OldLogProbs) and reference log-probs
        and the behaviour weights; the no-grad passes run here."""
        ids, attn = _tensor(batch.input_ids, torch.long), _tensor(batch.attention_mask, torch.long)
        temperature = float(batch.temperature)
        mask = (_tensor(batch.response_mask) * attn).float()
        mask[:, 0] = 0.0                      # column 0 has no prediction
        source = self._old_log_prob_source(batch)
        share = shared_prefix.prompt_lengths(_tensor(batch.response_mask), attn)
        if source is OldLogProbs.GIVEN:
            old = _tensor(batch.old_log_probs, torch.float32)
            ref = _tensor(batch.ref_log_prob, torch.float32)
        elif source is OldLogProbs.ON_POLICY:
            old, (ref,) = None, self._log_probs(ids, attn, share, temperature, batch.images,
                                                models=(self.ref,), groups=batch.group_ids)
        else:
            old, ref = self._log_probs(ids, attn, share, temperature, batch.images,
                                       groups=batch.group_ids)
        behavior_w, behavior_metrics = self._behavior_weight(batch, old, mask)
        unit_ids = shared_prefix.units(ids, share, _classes(batch.images), batch.group_ids)
        return _UpdateInputs(ids, attn, mask, _tensor(batch.advantages, torch.float32),
                             temperature, batch.images, source, old, ref, behavior_w,
                             behavior_metrics, share, unit_ids,
                             self._units(attn, ids, share, unit=unit_ids))

    def _train(self, x: _UpdateInputs) -> tuple[UpdateSums, list[float], int, int]:
        """ppo_epochs passes over mini-batches drawn from one permutation seeded by the seed and
        the step (the same on every rank). Returns this rank's sums, the gradient norms, the
        optimizer steps skipped (a non-finite norm) and those taken."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.global_step)
        sums, grad_norms, skipped, steps = UpdateSums(), [], 0, 0
        for _ in range(self.settings.ppo_epochs):
            for mb in self._permuted(x, gen).split(self.mini):
                sums, norm, stepped = self._mini_batch_step(x, mb, sums)
                skipped += not stepped
                steps += 1
                grad_norms.append(norm)
        return sums, grad_norms, skipped, steps

    def _permuted(self, x: _UpdateInputs, gen: torch.Generator) -> torch.Tensor:
        """The rows in a seeded random order of whole units (a group's rows stay in one
        mini-batch, as verl's batch order keeps them, and the prefix they share can run once);
        rows one by one where every row is its own unit."""
        members: dict[int, list[int]] = {}
        for i, u in enumerate(x.unit_ids.tolist()):
            members.setdefault(u, []).append(i)
        order = list(members.values())
        return torch.tensor([i for k in torch.randperm(len(order), generator=gen).tolist()
                             for i in order[k]], dtype=torch.long)

    def _mini_batch_step(self, x: _UpdateInputs, mb: torch.Tensor, sums: UpdateSums
                         ) -> tuple[UpdateSums, float, bool]:
        """One optimizer step on mini-batch `mb` (rows of the global batch): this rank's rows
        in micro-batches, gradients accumulated, then clipped. Returns `sums` (the update's so
        far) with each micro-batch's added in turn, the gradient norm and whether the step was
        taken."""
        # what no micro-batch sees: every rank holds the full batch, so these are global
        info = {"dp_size": self.world_size, "batch_num_tokens": x.mask[mb].sum().clamp_min(1.0),
                "global_batch_size": (x.mask[mb].sum(1) > 0).sum().clamp_min(1),
                # a constant for the whole update (never a micro-batch's own width)
                "loss_scale_factor": self.settings.loss_scale_factor or x.ids.shape[1]}
        rows, weight = self._shard_rows(mb, x.units)
        self.optim.zero_grad(set_to_none=True)
        for pos in self._micro_batches(rows, x.attn, x.units):
            sums += self._micro_batch(x, rows[pos], weight[pos], info)
        norm, stepped = fsdp.clip_and_step(self.model, self.optim, self.settings.grad_clip,
                                           self.world_size)
        return sums, norm, stepped

    def _micro_batch(self, x: _UpdateInputs, r: torch.Tensor, w: torch.Tensor,
                     info: dict) -> UpdateSums:
        """Forward and backward of rows `r` (weights `w`: 0 for a padding row). Each loss term
        is this micro-batch's share of the mini-batch's aggregate, times world_size (FSDP
        averages gradients over ranks): summed, they are the one-batch loss whatever the
        micro-batching and the world size."""
        s = self.settings
        L = int(x.attn[r].sum(1).max())       # right-padded: the rest is padding
        m = (x.mask[r, :L] * w[:, None]).to(self.device)
        logp, ent = self._token_logp(
            self.model, x.ids[r, :L].to(self.device), x.attn[r, :L].to(self.device),
            x.temperature, entropy=True, vision=self._vision_kwargs(x.ids[r, :L], x.images, r),
            share=x.share[r], classes=_classes(x.images, r))
        old = logp.detach() if x.source is OldLogProbs.ON_POLICY else x.old[r, :L].to(self.device)
        pg, pg_metrics = self.policy_loss(
            old, logp, x.adv[r, None].to(self.device), m, self.loss_agg_mode,
            {**self.clip, "global_batch_info": info},
            None if x.behavior_w is None else x.behavior_w[r, :L].to(self.device))
        kl = agg_loss(kl_penalty(logp, x.ref[r, :L].to(self.device), s.kl_loss_type),
                      m, self.loss_agg_mode, **info)
        entropy = agg_loss(ent, m, self.loss_agg_mode, **info)
        loss = pg + s.kl_loss_coef * kl - s.entropy_coeff * entropy
        loss.backward()
        tokens = float(m.sum())
        return UpdateSums(
            pg_loss=float(pg.detach()) / self.world_size,
            kl_loss=float(kl.detach()) / self.world_size,
            entropy=float(entropy.detach()) / self.world_size,
            pg_clipfrac=pg_metrics["actor/pg_clipfrac"] * tokens,
            pg_clipfrac_lower=pg_metrics["actor/pg_clipfrac_lower"] * tokens,
            ppo_kl=pg_metrics["actor/ppo_kl"] * tokens, tokens=tokens,
            positions=float(x.attn[r, :L].sum()) if s.use_remove_padding else len(r) * L,
            real_positions=float((x.attn[r, :L] * (w > 0)[:, None]).sum()))

    def _step_metrics(self, grad_norms: list[float], skipped: int) -> dict:
        """The optimizer's figures, and the largest peak resident memory of any rank so far
        (verl's perf/* on the CPU side; collective)."""
        rss = torch.tensor([peak_rss_bytes() / 2**30], dtype=torch.float64, device=self.device)
        dist.all_reduce(rss, op=dist.ReduceOp.MAX)
        return {"actor/grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0,
                "actor/lr": float(self.optim.param_groups[0]["lr"]),
                "actor/skipped_steps": float(skipped), "perf/max_rss_gib": float(rss)}

    def _hf_state(self, sd: dict, dtype=None, drop_tied: bool = False,
                  trained_only: bool = False, checkpoint_names: bool = False) -> dict:
        """Full state dict -> HF keys with independent storage (safetensors refuses shared);
        trained_only leaves out the frozen vision tower (it never changes); checkpoint_names
        renames to the on-disk names (fsdp.to_checkpoint_names) that vLLM and
        from_pretrained read."""
        sd = self.weights.hf_state(sd)        # LoRA: HF names, adapters merged
        for dup, src in self.tied.items():
            if dup not in sd and src in sd:
                sd[dup] = sd[src]
        out, seen = {}, set()
        for k in self.hf_keys:
            if (drop_tied and k in self.tied) or (trained_only and k in self.frozen):
                continue
            v = sd[k].detach().to("cpu", dtype or sd[k].dtype).contiguous()
            if v.data_ptr() in seen:
                v = v.clone()
            seen.add(v.data_ptr())
            out[k] = v
        return fsdp.to_checkpoint_names(self.model, out) if checkpoint_names else out

    # ------------------------------------------------------------------ weight sync
    def _sync_names(self) -> list[tuple[str, str]]:
        """(module name, checkpoint name) of every tensor the engines receive, in a fixed
        order: the state dict's keys without tied duplicates (vLLM ties them itself) and
        without the frozen vision tower (the engines hold it from their start)."""
        if not hasattr(self, "_sync_pairs"):
            self._sync_pairs = self.weights.sync_pairs(       # LoRA: the adapters alone
                self._weight_pairs, [n for n, _ in self.model.named_parameters()])
        return self._sync_pairs

    def _weight_pairs(self) -> list[tuple[str, str]]:
        """_sync_names of a sync of plain weights."""
        tensors = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        keys = [k for k in self.hf_keys if k not in self.tied and k not in self.frozen]
        probe = {k: torch.empty(tensors[self.weights.param_name(k)].shape, device="meta")
                 for k in keys}
        renamed = fsdp.to_checkpoint_names(self.model, probe)
        by_id = {id(v): k for k, v in renamed.items()}
        if len(renamed) != len(probe) or any(id(v) not in by_id for v in probe.values()):
            raise NotImplementedError(
                f"{type(self.model).__name__}: saving converts weights beyond renaming "
                "them; weight sync sends module tensors one by one and cannot follow it")
        return [(k, by_id[id(probe[k])]) for k in keys]

    @dispatch(Dispatch.ALL)
    def weight_metas(self, dtype: str) -> list[tuple[str, list[int], str]]:
        """(checkpoint name, shape, dtype) of the tensors `send_weights` broadcasts, in order;
        `dtype` is the engines' (they load in it)."""
        tensors = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        return [(ck, list(tensors[self.weights.param_name(k)].shape), dtype)
                for k, ck in self._sync_names()]

    @dispatch(Dispatch.ALL)
    def adapter_config(self) -> str | None:
        """adapter_config.json's text when the engines serve base + adapter (model.lora.rank > 0,
        merge false: a sync sends the adapters alone); None when they load plain weights."""
        return self.weights.adapter_config()

    @dispatch(Dispatch.ALL)
    def host_weight_sync(self, world_size: int,
                         timeout_s: float = 300.0) -> tuple[str, int] | None:
        """Rank 0: open the rendezvous of a new weight-sync group of `world_size` members (this
        rank and every engine worker) and return its address; others None. The group forms in
        `join_weight_sync` (peer_rl.workers.weight_sync); a new one replaces the previous one, which is
        aborted first (under NCCL a bucket of a failed sync may still be queued on it).
        `timeout_s`: the most one bucket may take (actor.weight_sync_timeout_s)."""
        if self.rank != 0:
            return None
        old, self._sync_group = getattr(self, "_sync_group", None), None
        if old is not None:
            old.abort()
        self._sync_store = weight_sync.make_store(self.master_addr, 0, world_size, 0)
        self._sync_world, self._sync_timeout = world_size, float(timeout_s)
        return self.master_addr, int(self._sync_store.port)

    @dispatch(Dispatch.ALL)
    def join_weight_sync(self) -> None:
        """Rank 0 joins the group hosted by `host_weight_sync` as its rank 0 (returns once the
        engines have joined too). Other ranks take no part in the group: they only help gather
        in `send_weights`."""
        if self.rank == 0:
            self._sync_group = weight_sync.open_group(self._sync_store, 0, self._sync_world,
                                                      self.backend, self._sync_timeout)

    @dispatch(Dispatch.ALL)
    def send_weights(self, metas: list, bucket_bytes: int) -> dict:
        """Broadcast the current weights to the engines, bucket by bucket. Collective: every
        rank gathers each FSDP-sharded tensor in turn (one at a time, so no rank holds the full
        model); rank 0 sends. Returns {"bytes", "seconds"} (rank 0's)."""
        t0 = time.perf_counter()
        tensors = dict(self.model.named_parameters()) | dict(self.model.named_buffers())

        def full(t):
            t = t.detach()
            return t.full_tensor() if isinstance(t, DTensor) else t

        # LoRA: each adapted weight merged with its adapters as it is gathered
        gathered = (self.weights.full_tensor(tensors, k, full) for k, _ in self._sync_names())
        if self.rank != 0:
            for _ in gathered:
                pass
            return {"bytes": 0, "seconds": time.perf_counter() - t0}
        if getattr(self, "_sync_group", None) is None:
            raise RuntimeError("send_weights before join_weight_sync")
        plan = [weight_sync.TensorMeta(m[0], tuple(m[1]), m[2]) for m in metas]
        sent = weight_sync.send(self._sync_group, gathered, plan, bucket_bytes, self.device,
                               self._sync_timeout)
        return {"bytes": sent, "seconds": time.perf_counter() - t0}

    def full_state(self) -> dict | None:
        """Rank 0: a snapshot of the full weights in checkpoint (HF) names, tied duplicates
        included; others None. Collective. Copies: on one rank the gathered state is the
        parameters' own storage, which the next update would change under the caller."""
        sd = fsdp.full_state_dict(self.model)
        if self.rank != 0:
            return None
        return {k: v.clone() for k, v in self._hf_state(sd, checkpoint_names=True).items()}

    @dispatch(Dispatch.ALL)
    def save_checkpoint(self, directory: str, hf_model: bool = True) -> None:
        """dcp/ (every rank writes its slices of the weights and AdamW state in parallel;
        peer_rl.workers.fsdp.save_sharded; LoRA: the adapters and their AdamW state only) and, with `hf_model`, model/ (rank 0, HF format, fp32 master
        weights: what vLLM, `peer-rl eval` and from_pretrained read; it costs one full gather).
        Collective."""
        d = Path(directory)
        fsdp.save_sharded(d / "dcp", self.model, self.optim, self.rank,
                          keep=self.weights.in_checkpoint, global_step=self.global_step,
                          world_size=self.world_size, lora_rank=self.weights.rank)
        if hf_model:
            self.export_hf(str(d / "model"))
        dist.barrier()
        return {"rank": self.rank, "host": socket.gethostname(), "files": fsync_tree(d)}

    @dispatch(Dispatch.ALL)
    def write_probe(self, directory: str) -> dict:
        """A file in `directory` the controller must be able to see: trainer.output_dir on
        node-local disk would leave each node's shards where no other node can read them."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"rank{self.rank}-{socket.gethostname()}"
        path.write_text(str(os.getpid()))
        return {"rank": self.rank, "host": socket.gethostname(), "path": str(path)}

    @dispatch(Dispatch.ALL)
    def export_hf(self, directory: str) -> None:
        """The policy as a plain Hugging Face model directory (rank 0 writes; LoRA: the
        adapters merged, and adapter/ beside the weights in PEFT's format). Collective."""
        sd = fsdp.full_state_dict(self.model)
        if self.rank == 0:
            d = Path(directory)
            fsdp.copy_model_files(self.model_path, d)
            save_file(self._hf_state(sd, drop_tied=True, checkpoint_names=True),
                      str(d / "model.safetensors"), metadata={"format": "pt"})
            self.weights.save_adapter(sd, d / "adapter")    # LoRA: adapter/ in PEFT's format
        del sd
        dist.barrier()

    @dispatch(Dispatch.ALL)
    def load_checkpoint(self, directory: str) -> dict:
        """Restore weights, AdamW state and step counter from dcp/, resharded to this group's
        world size (it may differ from the one that wrote it). Collective. Returns the saved
        extra fields (global_step, world_size)."""
        self.weights.check_checkpoint(Path(directory) / "dcp")
        extra = fsdp.load_sharded(Path(directory) / "dcp", self.model, self.optim,
                                  keep=self.weights.in_checkpoint)
        self.global_step = int(extra["global_step"])
        dist.barrier()
        return extra

    @dispatch(Dispatch.ALL)
    def health(self) -> dict:
        return {"ok": dist.is_initialized(), "rank": self.rank, "world_size": self.world_size,
                "backend": self.backend, "device": str(self.device), "host": socket.gethostname(),
                "pid": os.getpid(), "global_step": self.global_step,
                "num_params": sum(p.numel() for p in self.model.parameters()),
                "dtype": self.dtype, "peak_rss_bytes": peak_rss_bytes()}

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
