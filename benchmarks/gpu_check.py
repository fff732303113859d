"""GPU check of the training path on one GPU, with torch, transformers and peft only (no Ray, no
vLLM, no network): sized for one H100 (80 GB) and a 15-minute device lease.

    python benchmarks/gpu_check.py --out gpu-check/             # on the GPU: 12 min at most
    python benchmarks/gpu_check.py --smoke --out /tmp/smoke/    # the same code on CPU, tiny shapes
    python benchmarks/gpu_check.py --parts lora,memory --out D  # some parts only

Each part runs in a process of its own (spawned; forked on --smoke, after one shared import) under
a timeout of its own, and writes DIR/<part>.json: name, ok, seconds, checks (name -> passed),
figures, error (the traceback's tail, or what stopped the process) and the versions it ran on;
its output goes to DIR/<part>.log. A part that fails or times out leaves the others running.
At the end one table; the exit status is 0 when every part is ok.

vl_policy (a, 150 s): the shipped tiny vision-language policy (peer_rl/bundled/models/tiny/policy,
    Qwen2.5-VL-shaped) in peer_rl.workers.policy.PolicyWorker on rows with two face frames each and
    text-only rows. float32: packed rows (actor.use_remove_padding, the default) against
    right-padded ones (a worker with it off), max |diff| <= 1e-4, the packed rows under
    actor.shared_prefix (auto: the two text rows' prompt run once; the two rows with other
    frames behind the same words not shared) on packing.attention_path's path (on the GPU
    flex_attention under a block mask, compiled; forward here, backward in the update below);
    other frames change their rows' log-probs and no other row's. bfloat16 compute over float32 master weights: the
    log-probs against float32 (mean |diff| <= 0.05), then one update step: a finite, non-zero
    gradient norm, no skipped step, and the log-probs move.
lora (b, 150 s): the same policy with LoRA r=8 on every linear layer (peer_rl.workers.lora), float32:
    only adapters train, as many as the planner counts (peer_rl.planning.memory.lora_params);
    the policy equals its reference before the update (B = 0) and the reference stays put
    after it while the policy moves; the base weights are unchanged; export_hf's merged weights
    and its PEFT adapter/ (over the base) give the worker's log-probs again in a plain
    transformers forward (max |diff| <= 1e-4).
weight_sync (c, 120 s): peer_rl.workers.weight_sync's bucket packing on device tensors, byte for byte:
    send() packs into a recording group, receive() unpacks the same buckets, and every tensor
    comes back equal to its source cast to the sync dtype (mixed dtypes, odd sizes, a 0-d
    tensor, a Qwen2.5-7B decoder layer on the GPU; a tensor larger than the bucket); then the
    policy worker's own send_weights (FSDP gather, cast, pack) over a one-member group of its
    backend (NCCL on the GPU, which refuses two ranks on one GPU), recorded on the way, against
    its full_state().
memory (d, 300 s): `peer-rl plan`'s policy-rank estimate (peer_rl.planning.memory.policy_rank)
    against the measured peak: a random Qwen2.5-7B-shaped policy with as many decoder layers as
    the estimate fits in --memory-gib (default 60: 10 layers, 3.4B parameters) and 90% of the
    free GPU memory, full weights, bfloat16 compute, recomputation on, reference offloaded, one
    update of --tokens (4,096) tokens in rows of --seq (1,024). The estimate without its CUDA
    context against torch.cuda.max_memory_allocated (also recorded when the step runs out of
    memory): ok if the peak is at most 1.25 x the estimate; the ratio is the figure. 60, not
    70: the 16-layer run on an H200 (docs/testing-and-benchmarks.md) peaked at 92.1 GiB against
    an estimate of 77.0, and 1.2 x a 70 GiB estimate would not fit an H100. On --smoke: the 4
    tiny layers on CPU within 1 GiB, the process's peak RSS reported and no ratio judged.

--smoke runs it all on CPU (CUDA hidden, gloo for the process groups) in under a minute;
tests/bench/test_gpu_check.py runs it with Ray and vLLM made unimportable. Written against
torch 2.13 / transformers 5.19, and for the GPU machine's torch 2.11 / transformers 5.17.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# name -> (letter, timeout in seconds on the GPU); the sum, 720 s, leaves a 15-minute lease room
# for the machine's start and the files' return
PARTS = {"vl_policy": ("a", 150), "lora": ("b", 150), "weight_sync": ("c", 120),
         "memory": ("d", 300)}
SMOKE_TIMEOUT = 90          # seconds a part may take on --smoke
F32_TOL = 1e-4              # float32: packed vs padded, merged export vs worker
BF16_MEAN_TOL = 0.05        # bfloat16 vs float32 log-probs, mean |diff| over real tokens
SEEKER = "I keep telling everyone I'm fine, but I'm not."
FACES = ("sad", None, "happy", None)          # part (a)'s rows: two with frames, two text only
OTHER_FACES = ("angry", None, "neutral", None)
REPLY = ("It sounds like you have been carrying a lot lately, and pretending to be fine takes "
         "energy too. What has been the hardest part?")
# --smoke's values for the Qwen2.5-7B shape's keys (the same keys: only the numbers differ)
SMOKE_SHAPE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                   num_attention_heads=2, num_key_value_heads=2, vocab_size=4096)


def qwen7b_shape(smoke: bool) -> dict:
    """peer_rl.planning.shapes' Qwen2.5-7B text shape (smoke: its keys at SMOKE_SHAPE's sizes),
    as Qwen2Config keywords: widths, layers, heads, vocabulary, tie_word_embeddings."""
    from peer_rl.planning.shapes import NAMED

    shape = {k: v for k, v in NAMED["Qwen2.5-7B"].items() if k != "max_position_embeddings"}
    return {**shape, **SMOKE_SHAPE} if smoke else shape


# ------------------------------------------------------------------------------ shared pieces
def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tiny_policy() -> str:
    from peer_rl.models.local import BUNDLED

    return str(BUNDLED / "models" / "tiny" / "policy")


def _worker(model: str, smoke: bool, settings, lora=None):
    """One policy rank (world size 1) on this machine's device: NCCL on the GPU, gloo on CPU."""
    from peer_rl.workers.policy import PolicyWorker

    return PolicyWorker(0, 1, "127.0.0.1", _port(), model, settings,
                        backend="gloo" if smoke else "nccl", lora_settings=lora)


def _frames(face: str | None) -> list[str]:
    """The bundled sample's two 64 x 64 frames of `face` (none for None)."""
    from peer_rl.models.local import BUNDLED

    return ([str(BUNDLED / "data" / "grpo" / "images" / f"face_{face}_{k}.png") for k in (1, 2)]
            if face else [])


def vl_batch(model: str):
    """An UpdateBatch of four right-padded rows, prompt + reply: rows 0 and 2 with two face
    frames each (FACES; their image tokens expanded as the processor does), rows 1 and 3 text
    only; replies of different lengths, three columns of extra padding."""
    import numpy as np
    from transformers import AutoTokenizer

    from peer_rl.prompts.multimodal import attach_images
    from peer_rl.protocol import UpdateBatch
    from peer_rl.supervised.examples import expand_image_tokens
    from peer_rl.workers.vision import VisionInputs

    tok = AutoTokenizer.from_pretrained(model)
    vision = VisionInputs(model)
    reply = tok(REPLY, add_special_tokens=False)["input_ids"]
    seqs, prompts, images = [], [], []
    for row, length in enumerate((9, 14, 5, 11)):
        frames = _frames(FACES[row])
        msgs = attach_images([{"role": "user", "content": SEEKER}], frames)
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if frames:
            ids, _ = expand_image_tokens(ids, ids, vision.image_token_id,
                                         [vision.tokens(f) for f in frames])
        seqs.append(ids + reply[:length])
        prompts.append(len(ids))
        images.append(frames)
    width = max(map(len, seqs)) + 3
    ids, attn, resp = (np.zeros((len(seqs), width), np.int64) for _ in range(3))
    for i, (seq, p) in enumerate(zip(seqs, prompts)):
        ids[i, :len(seq)], attn[i, :len(seq)], resp[i, p:len(seq)] = seq, 1, 1
    return UpdateBatch(ids, attn, resp, np.array([1.0, -1.0, 0.5, -0.5], np.float32),
                       images=images)


def _real(batch):
    """Positions with a prediction: real tokens after each row's first."""
    m = batch.attention_mask.astype(bool).copy()
    m[:, 0] = False
    return m


def _gap(x, y, where) -> tuple[float, float]:
    """(max, mean) |x - y| over `where`."""
    import numpy as np

    d = np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))[where]
    return float(d.max()), float(d.mean())


def _log_probs(worker, batch):
    """The worker's (policy, reference) token-aligned log-probs, (rows, columns) numpy."""
    out = worker.compute_log_prob(batch)
    return out.old_log_probs, out.ref_log_prob


def _peak_gib(device) -> float:
    """The device's peak allocated memory (GPU), else the process's peak RSS, in GiB."""
    import torch

    from peer_rl.tracking.metrics import peak_rss_bytes

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return peak_rss_bytes() / 2**30


# ------------------------------------------------------------------------------ (a) vl_policy
def part_vl_policy(smoke: bool, args, figures: dict, checks: dict) -> None:
    from dataclasses import replace

    import numpy as np

    from peer_rl.compute.kv_cache import read_config
    from peer_rl.compute.precision import cpu_has_bf16
    from peer_rl.config.worker_settings import PolicySettings

    model = _tiny_policy()
    batch = vl_batch(model)
    real = _real(batch)
    image_rows = real & np.array([[bool(f)] for f in FACES])
    figures.update(tokens=int(batch.attention_mask.sum()), image_tokens=int(
        (batch.input_ids == read_config(model)["image_token_id"]).sum()))
    # float32, right-padded rows (actor.use_remove_padding=false: transformers' own SDPA with
    # the padding mask), then packed rows (the default) from the same checkpoint
    w = _worker(model, smoke, PolicySettings(dtype="float32", use_remove_padding=False))
    padded, _ = _log_probs(w, batch)
    w.shutdown()
    w = _worker(model, smoke, PolicySettings(dtype="float32"))
    f32, _ = _log_probs(w, batch)
    from peer_rl.compute.packing import attention_path

    figures["attention_path"] = attention_path(w.device)
    # the policy's and the reference's pass; the text rows' prompt once in each
    figures["forward_tokens"] = int(w.forward_tokens)
    checks["shared_prompt_ran_once"] = w.forward_tokens < 2 * figures["tokens"]
    figures["f32_packed_vs_padded_max"] = _gap(f32, padded, real)[0]
    figures["f32_mean_logp"] = float(f32[real].mean())
    checks["f32_log_probs_finite"] = bool(np.isfinite(f32).all())
    checks["f32_packed_equals_padded"] = figures["f32_packed_vs_padded_max"] <= F32_TOL
    # the frames matter: other faces (the same token counts) change the image rows only
    other, _ = _log_probs(w, replace(batch, images=[_frames(f) for f in OTHER_FACES]))
    figures["image_rows_change_max"] = _gap(other, f32, image_rows)[0]
    figures["text_rows_change_max"] = _gap(other, f32, real & ~image_rows)[0]
    checks["frames_change_their_rows"] = figures["image_rows_change_max"] > 1e-3
    checks["text_rows_unchanged"] = figures["text_rows_change_max"] <= F32_TOL
    w.shutdown()
    # training: bfloat16 compute over float32 master weights, as on the cluster's GPUs; a smoke
    # run on a CPU without native bfloat16 (several times slower there) runs float32 instead
    train = "bfloat16" if not smoke or cpu_has_bf16() else "float32"
    figures["train_dtype"] = train
    w = _worker(model, smoke, PolicySettings(dtype=train, lr=1e-4, ppo_mini_batch_size=4))
    before, _ = _log_probs(w, batch)
    figures["train_vs_f32_max"], figures["train_vs_f32_mean"] = _gap(before, f32, real)
    checks["train_dtype_agrees_with_f32"] = figures["train_vs_f32_mean"] <= BF16_MEAN_TOL
    t0 = time.perf_counter()
    m = w.update(batch)
    figures["update_s"] = time.perf_counter() - t0
    after, _ = _log_probs(w, batch)
    figures.update(grad_norm=m["actor/grad_norm"], pg_loss=m["actor/pg_loss"],
                   skipped_steps=m["actor/skipped_steps"], moved_max=_gap(after, before, real)[0],
                   peak_gib=_peak_gib(w.device))
    checks["grad_norm_finite_positive"] = (math.isfinite(m["actor/grad_norm"])
                                           and m["actor/grad_norm"] > 0)
    checks["step_taken"] = m["actor/skipped_steps"] == 0 and math.isfinite(m["actor/pg_loss"])
    checks["log_probs_moved"] = figures["moved_max"] > 0
    w.shutdown()


# ------------------------------------------------------------------------------ (b) lora
def hf_log_probs(model, batch, model_path: str, device):
    """Token-aligned log-probs of a plain transformers forward over right-padded rows (the
    oracle: no packing, no chunked head, no FSDP)."""
    import torch

    from peer_rl.workers.vision import VisionInputs

    ids = torch.as_tensor(batch.input_ids)
    attn = torch.as_tensor(batch.attention_mask)
    kw = {k: v.to(device) for k, v in VisionInputs(model_path)(ids, batch.images).items()}
    with torch.no_grad():
        logits = model(input_ids=ids.to(device), attention_mask=attn.to(device), use_cache=False,
                       **kw).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None].to(device))[..., 0]
    return torch.nn.functional.pad(logp, (1, 0)).cpu().numpy() * batch.attention_mask


def part_lora(smoke: bool, args, figures: dict, checks: dict) -> None:
    import tempfile

    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from peer_rl.compute.kv_cache import read_config
    from peer_rl.planning.memory import lora_params
    from peer_rl.config.worker_settings import LoRASettings, PolicySettings
    from peer_rl.workers import fsdp

    model = _tiny_policy()
    batch = vl_batch(model)
    real = _real(batch)
    lora = LoRASettings(rank=8, lora_alpha=16.0, target_modules=["all-linear"])
    w = _worker(model, smoke, PolicySettings(dtype="float32", lr=1e-2, ppo_mini_batch_size=4,
                                             kl_loss_coef=0.0), lora=lora)
    trainable = {n: p.numel() for n, p in w.model.named_parameters() if p.requires_grad}
    figures["trainable"] = sum(trainable.values())
    figures["planner_lora_params"] = lora_params(read_config(model), lora.rank,
                                                 lora.target_modules)
    checks["only_adapters_train"] = bool(trainable) and all(".lora_" in n for n in trainable)
    checks["planner_counts_the_adapters"] = figures["trainable"] == figures["planner_lora_params"]
    policy0, ref0 = _log_probs(w, batch)
    figures["policy_vs_ref_before"] = _gap(policy0, ref0, real)[0]
    checks["policy_is_reference_before"] = figures["policy_vs_ref_before"] <= 1e-6
    before = {k: v.clone() for k, v in fsdp.full_state_dict(w.model).items()}
    m = w.update(batch)
    after = fsdp.full_state_dict(w.model)
    figures["grad_norm"] = m["actor/grad_norm"]
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    figures["tensors_changed"] = len(changed)
    checks["base_unchanged_adapters_moved"] = bool(changed) and all(".lora_" in k
                                                                    for k in changed)
    policy1, ref1 = _log_probs(w, batch)
    figures["ref_drift"] = _gap(ref1, ref0, real)[0]
    figures["policy_moved"] = _gap(policy1, policy0, real)[0]
    checks["reference_stays"] = figures["ref_drift"] <= 1e-6
    checks["policy_moves"] = figures["policy_moved"] > 1e-4
    with tempfile.TemporaryDirectory(prefix="peer-rl-gpu-check-lora-") as tmp:
        out = Path(tmp) / "export"
        w.export_hf(str(out))
        merged = AutoModelForImageTextToText.from_pretrained(
            str(out), dtype=torch.float32).to(w.device).eval()
        figures["merged_export_vs_worker"] = _gap(hf_log_probs(merged, batch, model, w.device),
                                                  policy1, real)[0]
        del merged
        base = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float32)
        adapted = PeftModel.from_pretrained(base, str(out / "adapter")).to(w.device).eval()
        figures["peft_adapter_vs_worker"] = _gap(hf_log_probs(adapted, batch, model, w.device),
                                                 policy1, real)[0]
    checks["merged_export_matches"] = figures["merged_export_vs_worker"] <= F32_TOL
    checks["peft_adapter_matches"] = figures["peft_adapter_vs_worker"] <= F32_TOL
    figures["peak_gib"] = _peak_gib(w.device)
    w.shutdown()


# ------------------------------------------------------------------------------ (c) weight_sync
class _Done:
    """A collective that is over when returned (the recording groups copy at once); waited on
    as weight_sync.finish waits, with a timeout."""

    def wait(self, timeout=None):
        return True


class Recorder:
    """A sender's process group that keeps a copy of every bucket it broadcasts, passing each
    on to `inner` (a real group) when given."""

    def __init__(self, inner=None):
        self.inner, self.buckets = inner, []

    def broadcast(self, flat, root):
        if self.inner is not None:
            self.inner.broadcast(flat, root).wait()
        self.buckets.append(flat.clone())
        return _Done()


class Replayer:
    """A receiver's process group whose broadcasts deliver the recorded buckets in order."""

    def __init__(self, buckets):
        self.buckets = iter(buckets)

    def broadcast(self, flat, root):
        src = next(self.buckets)
        if src.numel() != flat.numel():
            raise ValueError(f"bucket of {flat.numel()} bytes expected, {src.numel()} recorded")
        flat.copy_(src)
        return _Done()


def round_trip(tensors, metas, bucket_bytes: int, device) -> dict:
    """Pack `tensors` with weight_sync.send into a Recorder, unpack with weight_sync.receive:
    {"bytes" sent, "recorded", "buckets", "planned" (plan_buckets' count), "mismatched": names
    whose bytes differ from the source cast to the meta's dtype, "pack_s" (with the recorder's
    copy of each bucket), "unpack_s"}."""
    import torch

    from peer_rl.workers import weight_sync

    tensors = list(tensors)
    rec = Recorder()
    _sync(device)
    t0 = time.perf_counter()
    sent = weight_sync.send(rec, tensors, metas, bucket_bytes, device)
    _sync(device)
    t1 = time.perf_counter()
    got = {}
    for bucket in weight_sync.receive(Replayer(rec.buckets), metas, bucket_bytes, device):
        got.update({k: v.clone() for k, v in bucket})
    _sync(device)
    t2 = time.perf_counter()
    bad = []
    for m, t in zip(metas, tensors):
        want = t.detach().to(device=device, dtype=getattr(torch, m.dtype)).contiguous()
        have = got.get(m.name)
        if (have is None or tuple(have.shape) != m.shape
                or not torch.equal(have.reshape(-1).view(torch.uint8),
                                   want.reshape(-1).view(torch.uint8))):
            bad.append(m.name)
    return {"bytes": sent, "recorded": sum(b.numel() for b in rec.buckets),
            "buckets": len(rec.buckets),
            "planned": len(weight_sync.plan_buckets(metas, bucket_bytes)),
            "mismatched": bad, "pack_s": t1 - t0, "unpack_s": t2 - t1}


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _layer_tensors(shape: dict, device) -> dict:
    """One Qwen2 decoder layer's tensors (float32, random) at `shape`, plus odd ones: a 0-d
    scalar, odd element counts, an integer tensor."""
    import torch

    h, i = shape["hidden_size"], shape["intermediate_size"]
    kv = shape["num_key_value_heads"] * (h // shape["num_attention_heads"])
    shapes = {"q_proj.weight": (h, h), "q_proj.bias": (h,), "k_proj.weight": (kv, h),
              "v_proj.weight": (kv, h), "o_proj.weight": (h, h), "gate_proj.weight": (i, h),
              "up_proj.weight": (i, h), "down_proj.weight": (h, i), "norm.weight": (h,),
              "odd.a": (7, 3), "odd.b": (301,), "odd.scalar": ()}
    g = torch.Generator(device=device).manual_seed(0)
    out = {k: torch.randn(s, generator=g, device=device) for k, s in shapes.items()}
    out["odd.count"] = torch.randint(0, 9, (5,), generator=g, device=device)
    return out


def part_weight_sync(smoke: bool, args, figures: dict, checks: dict) -> None:
    import torch

    from peer_rl.config.worker_settings import PolicySettings
    from peer_rl.workers.weight_sync import TensorMeta, receive

    device = torch.device("cpu") if smoke else torch.device("cuda", 0)
    # the packing itself: a 7B decoder layer (smoke: a tiny one) in mixed dtypes
    tensors = _layer_tensors(qwen7b_shape(smoke), device)
    kinds = ("bfloat16", "float32", "float16")
    metas = [TensorMeta(k, tuple(t.shape), "int64" if t.dtype == torch.int64 else kinds[n % 3])
             for n, (k, t) in enumerate(tensors.items())]
    largest = max(m.nbytes for m in metas)
    total = sum(m.nbytes for m in metas)
    for label, bucket in (("one_bucket", 2 * total), ("small_buckets", largest // 3 + 1)):
        r = round_trip(tensors.values(), metas, bucket, device)
        figures[f"{label}_buckets"] = r["buckets"]
        figures[f"{label}_mismatched"] = r["mismatched"]
        checks[f"{label}_bytes_equal"] = (not r["mismatched"] and r["buckets"] == r["planned"]
                                          and r["bytes"] == r["recorded"])
        figures[f"{label}_pack_s"], figures[f"{label}_unpack_s"] = r["pack_s"], r["unpack_s"]
    figures["layer_mb"] = total / 1e6
    del tensors
    # the policy worker's own path: FSDP gather, cast, pack, a real one-member group
    w = _worker(_tiny_policy(), smoke, PolicySettings(dtype="float32"))
    wire = w.weight_metas("bfloat16")
    plan = [TensorMeta(n, tuple(s), d) for n, s, d in wire]
    w.host_weight_sync(1)
    w.join_weight_sync()
    real_group = w._sync_group            # set by join_weight_sync; recorded on its way out
    w._sync_group = Recorder(real_group)
    bucket = 1 << 20
    stats = w.send_weights(wire, bucket)
    rec = w._sync_group
    w._sync_group = real_group
    state = w.full_state()
    got = {}
    for chunk in receive(Replayer(rec.buckets), plan, bucket, w.device):
        got.update({k: v.clone() for k, v in chunk})
    bad = [m.name for m in plan if m.name not in got
           or not torch.equal(got[m.name].cpu(), state[m.name].to(torch.bfloat16))]
    figures.update(worker_tensors=len(plan), worker_buckets=len(rec.buckets),
                   worker_bytes=stats["bytes"], worker_mismatched=bad,
                   worker_backend=w.backend)
    checks["worker_sync_bytes_equal"] = (not bad and len(got) == len(plan)
                                         and stats["bytes"] == sum(b.numel() for b in rec.buckets))
    w.shutdown()


# ------------------------------------------------------------------------------ (d) memory
def memory_settings(tokens: int, seq: int, dtype: str):
    """The policy rank's settings (PolicySettings) for part (d), and the `actor` view of them the
    planner reads (the same fields plus the group's world size)."""
    from types import SimpleNamespace

    from peer_rl.config.worker_settings import PolicySettings

    rows = max(1, tokens // seq)
    s = PolicySettings(lr=1e-6, dtype=dtype, ppo_mini_batch_size=rows, ppo_micro_batch_size=rows,
                       ppo_max_token_len_per_gpu=rows * seq, logits_chunk_size=1024,
                       gradient_checkpointing=True, ref_param_offload=True)
    return s, SimpleNamespace(**vars(s), world_size=1)


def fit_layers(shape: dict, actor, budget_bytes: float, gpu_gib: float, device):
    """(layers, estimate): the most decoder layers (at most the shape's) whose policy-rank
    estimate is within `budget_bytes`; (0, None) if not even one is."""
    from peer_rl.planning.memory import policy_rank
    from peer_rl.planning.shapes import text_params
    from peer_rl.config.worker_settings import LoRASettings

    best = (0, None)
    for layers in range(1, shape["num_hidden_layers"] + 1):
        config = {**shape, "num_hidden_layers": layers}
        est = policy_rank(config, text_params(config), 0, actor, LoRASettings(), gpu_gib, device)
        if est.total > budget_bytes:
            break
        best = (layers, est)
    return best


def part_memory(smoke: bool, args, figures: dict, checks: dict) -> None:
    import tempfile

    import numpy as np
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from peer_rl.compute.activation_memory import GiB
    from peer_rl.planning import memory
    from peer_rl.protocol import UpdateBatch

    if smoke:
        import psutil

        dtype, device = "float32", torch.device("cpu")
        gib = psutil.virtual_memory().total / GiB
        budget, est_device = args.memory_gib * GiB, memory.cpu_device(dtype)
        tokens, seq = 256, 64
    else:
        dtype, device = "bfloat16", torch.device("cuda", 0)
        free, total = torch.cuda.mem_get_info(device)
        gib = total / GiB
        budget, est_device = min(args.memory_gib * GiB, 0.9 * free), memory.GPU
        tokens, seq = args.tokens, args.seq
    shape = qwen7b_shape(smoke)
    settings, actor = memory_settings(tokens, seq, dtype)
    layers, est = fit_layers(shape, actor, budget, gib, est_device)
    figures.update(layers=layers, budget_gib=budget / GiB, device_gib=gib, tokens=tokens, seq=seq)
    checks["a_layer_fits"] = layers > 0
    if not layers:
        return
    figures.update(estimate_gib=est.total / GiB, estimate_detail=est.detail,
                   estimate_parts_gib={k: round(v / GiB, 3) for k, v in est.parts.items()})
    config = Qwen2Config(**{**shape, "num_hidden_layers": layers})
    with tempfile.TemporaryDirectory(prefix="peer-rl-gpu-check-memory-") as tmp:
        t0 = time.perf_counter()
        torch.manual_seed(0)
        with torch.device(device):
            model = Qwen2ForCausalLM(config).to(torch.bfloat16)
        figures["params"] = sum(p.numel() for p in model.parameters())
        model.save_pretrained(tmp)
        del model
        figures["build_s"] = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        rows = max(1, tokens // seq)
        rng = np.random.default_rng(0)
        resp = np.zeros((rows, seq), np.int64)
        resp[:, seq // 2:] = 1
        batch = UpdateBatch(rng.integers(0, shape["vocab_size"], (rows, seq)),
                            np.ones((rows, seq), np.int64), resp,
                            rng.standard_normal(rows).astype(np.float32))
        w = None
        try:
            t0 = time.perf_counter()
            w = _worker(tmp, smoke, settings)
            figures["load_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            m = w.update(batch)
            _sync(device)
            figures.update(update_s=time.perf_counter() - t0, grad_norm=m["actor/grad_norm"],
                           recompute=w.recompute)
            checks["grad_norm_finite_positive"] = (math.isfinite(m["actor/grad_norm"])
                                                   and m["actor/grad_norm"] > 0)
            checks["recompute_as_planned"] = w.recompute
        finally:      # the peak so far, also when the step ran out of memory
            if device.type == "cuda":
                parts = est.total - est.parts.get("CUDA context", 0)
                peak = torch.cuda.max_memory_allocated(device)
                figures.update(measured_gib=peak / GiB,
                               reserved_gib=torch.cuda.max_memory_reserved(device) / GiB,
                               estimate_without_context_gib=parts / GiB,
                               ratio=parts / peak)    # estimate / measured, as `bench memory`
                checks["peak_within_125pct_of_estimate"] = peak <= 1.25 * parts
            else:   # the process's peak RSS holds the interpreter and libraries: no ratio
                figures.update(rss_gib=_peak_gib(device), ratio=None)
            if w is not None:
                w.shutdown()


# ------------------------------------------------------------------------------ running parts
def _versions() -> dict:
    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "python": sys.version.split()[0]}
    try:
        import peft

        out["peft"] = peft.__version__
    except ImportError:
        out["peft"] = None
    out["device"] = (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    return out


def _write(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, path)


def run_part(name: str, out: str, smoke: bool, args) -> None:
    """A part's process: its output to DIR/<name>.log, its record to DIR/<name>.json."""
    out_dir = Path(out)
    log = open(out_dir / f"{name}.log", "w", encoding="utf-8")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    record = {"name": name, "part": PARTS[name][0], "smoke": smoke, "ok": False, "checks": {},
              "figures": {}, "error": None}
    t0 = time.perf_counter()
    try:
        record["versions"] = _versions()
        globals()[f"part_{name}"](smoke, args, record["figures"], record["checks"])
        checks = record["checks"]
        record["ok"] = bool(checks) and all(checks.values())
        if not record["ok"]:
            record["error"] = "failed: " + ", ".join(k for k, v in checks.items() if not v)
    except BaseException as exc:          # noqa: BLE001 - the record says what stopped it
        # figures and checks so far stay in the record
        record["error"] = "".join(traceback.format_exception(exc))[-4000:]
    record["seconds"] = time.perf_counter() - t0
    _write(out_dir / f"{name}.json", record)
    log.flush()
    # the record is on disk: leave now, so a process group's teardown at interpreter exit (an
    # NCCL communicator's, say) cannot hold the part until its timeout
    os._exit(0)


def _preload() -> None:
    """--smoke: import what every part needs once, before the parts are forked (no device is
    touched here, so the forked children start clean)."""
    import peft  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoProcessor, Qwen2ForCausalLM  # noqa: F401

    import peer_rl.workers.policy  # noqa: F401
    import peer_rl.workers.vision  # noqa: F401


def _summary(rec: dict) -> str:
    f = rec.get("figures") or {}

    def g(key, fmt="{:.2e}"):
        v = f.get(key)
        return "-" if v is None else (fmt.format(v) if isinstance(v, (int, float)) else str(v))

    name = rec["name"]
    if name == "vl_policy":
        return (f"f32 packed-padded {g('f32_packed_vs_padded_max')}, {g('train_dtype', '{}')}"
                f"-f32 mean {g('train_vs_f32_mean')}, grad norm {g('grad_norm', '{:.3g}')}")
    if name == "lora":
        return (f"{g('trainable', '{:d}')} adapter params, merged export "
                f"{g('merged_export_vs_worker')}, PEFT adapter {g('peft_adapter_vs_worker')}")
    if name == "weight_sync":
        return (f"layer {g('layer_mb', '{:.2f}')} MB in 1 and {g('small_buckets_buckets', '{:d}')} "
                f"buckets; worker {g('worker_tensors', '{:d}')} tensors in "
                f"{g('worker_buckets', '{:d}')} over {g('worker_backend', '{}')}")
    if name == "memory" and f.get("rss_gib") is not None:
        return (f"{g('layers', '{:d}')} layers, estimate {g('estimate_gib', '{:.2f}')} GiB, "
                f"process peak RSS {g('rss_gib', '{:.2f}')} GiB (no ratio on CPU)")
    if name == "memory":
        return (f"{g('layers', '{:d}')} layers, estimate {g('estimate_gib', '{:.1f}')} GiB, "
                f"measured {g('measured_gib', '{:.1f}')} GiB, estimate/measured "
                f"{g('ratio', '{:.2f}')}")
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for <part>.json and <part>.log")
    ap.add_argument("--smoke", action="store_true", help="everything on CPU, tiny shapes")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated, of {', '.join(PARTS)} (default all)")
    ap.add_argument("--memory-gib", type=float, default=60.0,
                    help="memory: the estimate's ceiling for choosing the layer count (GiB)")
    ap.add_argument("--tokens", type=int, default=4096, help="memory: tokens in the update")
    ap.add_argument("--seq", type=int, default=1024, help="memory: tokens per row")
    ap.add_argument("--start", choices=("fork", "spawn"), default=None,
                    help="how a part's process starts (default: fork after one shared import on "
                         "--smoke; spawn otherwise, so no CUDA state is inherited)")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"--parts: {', '.join(unknown)} unknown; expected some of {', '.join(PARTS)}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # torch.cuda.is_available() through NVML: the driver is not initialised here, so a part's
    # process (forked too) starts CUDA itself
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    if args.smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""       # the smoke run is a CPU run everywhere
        args.memory_gib = 1.0
    else:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA GPU here; --smoke runs the same code on CPU",
                  file=sys.stderr)
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import multiprocessing as mp

    start = args.start or ("fork" if args.smoke else "spawn")
    if start == "fork":
        _preload()
    ctx = mp.get_context(start)
    records, t_all = [], time.perf_counter()
    for name in parts:
        timeout = SMOKE_TIMEOUT if args.smoke else PARTS[name][1]
        path = out / f"{name}.json"
        path.unlink(missing_ok=True)
        print(f"[gpu-check] {name} ({PARTS[name][0]}), at most {timeout} s ...", flush=True)
        t0 = time.perf_counter()
        proc = ctx.Process(target=run_part, args=(name, str(out), args.smoke, args), name=name)
        proc.start()
        proc.join(timeout)
        stopped = proc.is_alive()
        if stopped:
            proc.kill()
            proc.join()
        if path.exists() and not stopped:
            rec = json.loads(path.read_text(encoding="utf-8"))
        else:
            log = out / f"{name}.log"
            tail = log.read_text(encoding="utf-8", errors="replace")[-3000:] if log.exists() else ""
            why = (f"stopped after its {timeout} s timeout" if stopped
                   else f"its process ended with exit code {proc.exitcode} and no record")
            rec = {"name": name, "part": PARTS[name][0], "smoke": args.smoke, "ok": False,
                   "checks": {}, "figures": {}, "error": f"{why} (see {log.name})",
                   "log_tail": tail, "seconds": time.perf_counter() - t0}
            _write(path, rec)
        records.append(rec)
        print(f"[gpu-check] {name}: {'ok' if rec['ok'] else 'FAILED'} in {rec['seconds']:.1f} s",
              flush=True)
    print(f"\n{'part':14s} {'ok':4s} {'s':>6s}  figures  ({time.perf_counter() - t_all:.0f} s in "
          f"all; records in {out})")
    for rec in records:
        print(f"{rec['part']} {rec['name']:12s} {'yes' if rec['ok'] else 'NO':4s} "
              f"{rec['seconds']:6.1f}  {_summary(rec)}")
        if not rec["ok"]:
            print("    " + (rec.get("error") or "").strip().splitlines()[-1][:200])
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
