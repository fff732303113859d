"""PolicyWorker on real gloo groups (no mocks): 2 processes of their own, and 2 Ray actors.

The ranks are forked from a warm forkserver (spawn_util.start_ranks), each run's ranks fresh
processes. Each run executes one scenario function per rank and pickles its result for the test.
The world-1 run is the reference: FSDP2 over 2 ranks with the same global batch must reach the
same weights, which checks the sharding of rows, the global token-mean loss scaling and FSDP's
gradient averaging together.
"""
from __future__ import annotations

import os
import pickle
import shutil
import socket
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from peer_rl.algos import sequence_advantages
from peer_rl.protocol import UpdateBatch
from peer_rl.config.worker_settings import LoRASettings, PolicySettings
from lora_util import save_random_adapter
from spawn_util import start_ranks
from peer_rl.workers.policy import PolicyWorker

pytestmark = pytest.mark.e2e   # spawns FSDP2 gloo process groups

# PolicySettings; the mini-batch in rows. Right-padded rows: the packed route (the default) is
# held against this one in the test_packed_* tests
# float32: the invariances below are exact to ~1e-5, which bfloat16 compute (dtype auto on a CPU
# with AVX512-BF16) would blur; test_bfloat16_compute_keeps_float32_master_weights runs bfloat16
HP = dict(lr=1e-3, ppo_mini_batch_size=4, ppo_micro_batch_size=2, ppo_epochs=2,
          kl_loss_coef=0.01, entropy_coeff=0.01, use_remove_padding=False, dtype="float32")
SEED = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("tiny_qwen2")
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, vocab_size=256,
                      max_position_embeddings=64, tie_word_embeddings=True)
    Qwen2ForCausalLM(cfg).save_pretrained(d)
    return str(d)


def make_batch(n: int = 8, t: int = 16, seed: int = 0) -> UpdateBatch:
    """Right-padded prompt+response rows of different lengths (uneven tokens across ranks)."""
    rng = np.random.default_rng(seed)
    ids, attn, resp = (np.zeros((n, t), np.int64) for _ in range(3))
    for i in range(n):
        p = int(rng.integers(3, 7))
        r = int(rng.integers(2, t - p + 1))
        ids[i, :p + r] = rng.integers(1, 256, p + r)
        attn[i, :p + r] = 1
        resp[i, p:p + r] = 1
    scores = torch.tensor(rng.random(n))
    adv = sequence_advantages("grpo", scores, torch.arange(n) // 4).astype(np.float32)
    return UpdateBatch(ids, attn, resp, adv)


def grouped_batch(groups: int = 3, g: int = 4, t: int = 20, seed: int = 0,
                  n: int | None = None) -> UpdateBatch:
    """GRPO-shaped rows: `groups` prompts of 4-9 tokens, each with `g` replies of 1-8 tokens
    (a group's rows share their prompt, then differ); the first `n` rows if given."""
    rng = np.random.default_rng(seed)
    rows = groups * g
    ids, attn, resp = (np.zeros((rows, t), np.int64) for _ in range(3))
    for k in range(groups):
        prompt = rng.integers(1, 256, int(rng.integers(4, 10)))
        for i in range(k * g, (k + 1) * g):
            r = int(rng.integers(1, 9))
            ids[i, :len(prompt)], ids[i, len(prompt):len(prompt) + r] = prompt, \
                rng.integers(1, 256, r)
            attn[i, :len(prompt) + r] = 1
            resp[i, len(prompt):len(prompt) + r] = 1
    adv = sequence_advantages("grpo", torch.tensor(rng.random(rows)),
                              torch.arange(rows) // g).astype(np.float32)
    b = UpdateBatch(ids, attn, resp, adv)
    if n is None:
        return b
    return UpdateBatch(ids[:n], attn[:n], resp[:n], adv[:n])



def refined_batch(groups: int = 3, g: int = 4, t: int = 26, seed: int = 13) -> UpdateBatch:
    """ESCRAG-R1 pass 2's shape under the async look-ahead: each row's prompt is its group's
    dialogue (4-9 tokens) then tokens of its own (1-3: the exemplar retrieved for it), then a
    reply of 1-8; rows shuffled (a group's rows apart), each carrying its group id, the
    sampler's log-probs and a policy version one update old."""
    rng = np.random.default_rng(seed)
    rows = groups * g
    ids, attn, resp = (np.zeros((rows, t), np.int64) for _ in range(3))
    group = np.repeat(np.arange(groups), g)
    dialogues = [rng.integers(1, 256, int(rng.integers(4, 10))) for _ in range(groups)]
    for i in range(rows):
        prompt = np.concatenate([dialogues[group[i]], rng.integers(1, 256, int(rng.integers(1, 4)))])
        r = int(rng.integers(1, 9))
        ids[i, :len(prompt)], ids[i, len(prompt):len(prompt) + r] = prompt, rng.integers(1, 256, r)
        attn[i, :len(prompt) + r] = 1
        resp[i, len(prompt):len(prompt) + r] = 1
    adv = sequence_advantages("grpo", torch.tensor(rng.random(rows)),
                              torch.as_tensor(group)).astype(np.float32)
    behavior = (-5.5 + 0.2 * rng.standard_normal((rows, t))).astype(np.float32) * resp
    order = rng.permutation(rows)
    return UpdateBatch(ids[order], attn[order], resp[order], adv[order],
                       behavior_log_probs=behavior[order], max_staleness=1,
                       policy_versions=np.zeros(rows, np.int64), group_ids=group[order])

# ---------------------------------------------------------------- spawned scenarios (per rank)
def _count_layer_forwards(w: PolicyWorker) -> list[int]:
    """Count the policy's decoder-layer forwards that build a graph (training forwards and
    their recomputation in backward), beneath any checkpoint wrapper."""
    from functools import partial

    from peer_rl.workers.fsdp import decoder_layers

    calls = [0]

    def counting(inner):
        def counted(*a, **kw):
            calls[0] += torch.is_grad_enabled()
            return inner(*a, **kw)
        return counted

    for layer in decoder_layers(w.model):
        f = layer.forward
        if isinstance(f, partial):        # checkpoint(forward, ...): count the inner forward
            layer.forward = partial(f.func, counting(f.args[0]), *f.args[1:], **f.keywords)
        else:
            layer.forward = counting(f)
    return calls


def _sc_train(w: PolicyWorker, out: str, arg=None) -> dict:
    """`arg` "grouped": GRPO-shaped rows (grouped_batch) instead of unrelated ones."""
    grouped = arg == "grouped"
    b = grouped_batch() if grouped else make_batch()
    lp = w.compute_log_prob(b)
    calls = _count_layer_forwards(w)
    t = time.perf_counter()
    metrics = w.update(b)
    update_s = time.perf_counter() - t
    layer_calls = calls[0]
    # 7 rows: a 3-row mini-batch splits 2 + 1 over 2 ranks (the second rank pads a zero-weight row)
    metrics7 = w.update(grouped_batch(seed=4, n=7) if grouped else make_batch(n=7, seed=4))
    out = {"lp": lp, "metrics": metrics, "metrics7": metrics7, "update_s": update_s,
           "weights": w.full_state(), "health": w.health(), "layer_calls": layer_calls}
    # two rows of 16 and 8 tokens: in one forward the short one is padded to 16
    ids = np.zeros((2, 16), np.int64)
    ids[0], ids[1, :8] = np.arange(1, 17), np.arange(1, 9)
    attn = (ids > 0).astype(np.int64)
    resp = attn.copy()
    resp[:, :4] = 0
    return out | {"padded": w.update(UpdateBatch(ids, attn, resp,
                                                 np.array([1.0, -1.0], np.float32)))}


def _sc_ckpt(w: PolicyWorker, out: str, arg=None) -> dict:
    if arg:                                   # a rank's bytes per checkpoint file
        import peer_rl.workers.fsdp

        peer_rl.workers.fsdp.SHARD_FILE_BYTES = arg
    b = make_batch(seed=1)
    first = w.update(b)                       # one mini-batch: policy == reference throughout
    ckpt = os.path.join(out, "ckpt")
    w.save_checkpoint(ckpt)
    saved = w.full_state()
    w.update(b)
    perturbed = w.full_state()
    extra = w.load_checkpoint(ckpt)
    loaded = w.full_state()
    replayed_metrics = w.update(b)            # same weights + optimizer state + step -> same result
    return {"first": first, "saved": saved, "perturbed": perturbed, "loaded": loaded,
            "replayed": w.full_state(), "replayed_metrics": replayed_metrics, "ckpt": ckpt,
            "extra": extra}


def _sc_resume(w: PolicyWorker, out: str, ckpt=None) -> dict:
    """Load a checkpoint another world size wrote, then take the step that run took next."""
    extra = w.load_checkpoint(ckpt)
    metrics = w.update(make_batch(seed=1))
    return {"extra": extra, "metrics": metrics, "weights": w.full_state()}


def _sc_learn(w: PolicyWorker, out: str, arg=None) -> dict:
    b = make_batch(seed=2)
    before = w.compute_log_prob(b).old_log_probs
    times, metrics = [], []
    for _ in range(4):
        t = time.perf_counter()
        metrics.append(w.update(b))
        times.append(time.perf_counter() - t)
    return {"before": before, "after": w.compute_log_prob(b).old_log_probs, "times": times,
            "metrics": metrics}




class _Payload:
    """Unpickling this would create a marker file: proof that arbitrary code ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _sc_hostile(w: PolicyWorker, out: str, arg=None) -> dict:
    """Every file of the sharded checkpoint replaced by a pickle that would run code."""
    ckpt = os.path.join(out, "ckpt")
    w.save_checkpoint(ckpt, hf_model=False)
    marker = os.path.join(out, "pwned")
    shards = [f for f in os.listdir(os.path.join(ckpt, "dcp")) if f.endswith(".safetensors")]
    for f in shards:
        with open(os.path.join(ckpt, "dcp", f), "wb") as fh:
            pickle.dump({"state": _Payload(marker)}, fh)
    try:
        w.load_checkpoint(ckpt)
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"error": error, "ran": os.path.exists(marker), "shards": shards}


def vl_batch(model_path: str) -> UpdateBatch:
    """Rows 0 and 2 show two face frames, rows 1 and 3 are text: over 2 ranks, rank 0 holds
    only visual rows and rank 1 only text rows, so only rank 0's forward needs the tower."""
    from PIL import Image
    from transformers import AutoProcessor

    from peer_rl.data.bundled import sample_root
    from peer_rl.prompts.multimodal import attach_images

    proc = AutoProcessor.from_pretrained(model_path)
    faces = sample_root() / "grpo" / "images"
    seqs, images = [], []
    for i in range(4):
        frames = [str(faces / f"face_sad_{k}.png") for k in (1, 2)] if i % 2 == 0 else []
        msgs = attach_images([{"role": "user", "content": f"How do I seem? {i}"}], frames)
        text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = proc(text=[text], images=[Image.open(f).convert("RGB") for f in frames] or None)
        seqs.append(list(ids["input_ids"][0]) + [40 + i, 50, 60, 70 + i])
        images.append(frames)
    T = max(map(len, seqs))
    out = {k: np.zeros((4, T), np.int64) for k in ("input_ids", "attention_mask", "response_mask")}
    for i, seq in enumerate(seqs):
        out["input_ids"][i, :len(seq)], out["attention_mask"][i, :len(seq)] = seq, 1
        out["response_mask"][i, len(seq) - 4:len(seq)] = 1
    return UpdateBatch(out["input_ids"], out["attention_mask"], out["response_mask"],
                       np.array([1.0, -1.0, 0.5, -0.5], np.float32), images=images)


def vl_grouped_batch(model_path: str) -> UpdateBatch:
    """GRPO-shaped vision-language rows: three replies to one prompt showing the two sad
    frames, two replies to the same words showing the two happy frames (equal tokens,
    other pictures: they must not share), and two replies to a text prompt."""
    from PIL import Image
    from transformers import AutoProcessor

    from peer_rl.data.bundled import sample_root
    from peer_rl.prompts.multimodal import attach_images

    proc = AutoProcessor.from_pretrained(model_path)
    faces = sample_root() / "grpo" / "images"
    groups = [("sad", 3), ("happy", 2), (None, 2)]
    seqs, images, resp = [], [], []
    for g, (face, n) in enumerate(groups):
        frames = [str(faces / f"face_{face}_{k}.png") for k in (1, 2)] if face else []
        msgs = attach_images([{"role": "user", "content": "How do I seem today?"}], frames)
        text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = proc(text=[text], images=[Image.open(f).convert("RGB") for f in frames] or None)
        for k in range(n):
            reply = [40 + g, 50 + k, 60, 70 + k][:2 + k]
            seqs.append(list(ids["input_ids"][0]) + reply)
            images.append(frames)
            resp.append(len(reply))
    T = max(map(len, seqs))
    out = {k: np.zeros((len(seqs), T), np.int64)
           for k in ("input_ids", "attention_mask", "response_mask")}
    for i, seq in enumerate(seqs):
        out["input_ids"][i, :len(seq)], out["attention_mask"][i, :len(seq)] = seq, 1
        out["response_mask"][i, len(seq) - resp[i]:len(seq)] = 1
    adv = np.array([1.0, -1.0, 0.5, -0.5, 0.25, 1.0, -1.0], np.float32)
    return UpdateBatch(out["input_ids"], out["attention_mask"], out["response_mask"], adv,
                       images=images)


def _sc_vl_shared(w: PolicyWorker, out: str, arg=None) -> dict:
    """vl_grouped_batch: log-probs (counting the image patches the vision tower encodes),
    one update (its full gradient), log-probs after it."""
    from peer_rl.workers.fsdp import vision_tower

    b = vl_grouped_batch(w.model_path)
    tower, patches = vision_tower(w.model), []
    hook = tower.register_forward_pre_hook(lambda m, args: patches.append(int(args[0].shape[0])))
    lp = w.compute_log_prob(b).old_log_probs
    hook.remove()
    grads = _capture_grads(w)
    metrics = w.update(b)
    return {"lp": lp, "patches": sum(patches), "grads": dict(grads),
            "after": w.compute_log_prob(b).old_log_probs, "metrics": metrics}


def _sc_vl_mixed(w: PolicyWorker, out: str, arg=None) -> dict:
    b = vl_batch(w.model_path)
    lp = w.compute_log_prob(b).old_log_probs
    w.update(b)
    return {"lp": lp, "weights": w.full_state(), "after": w.compute_log_prob(b).old_log_probs}


def _sc_async(w: PolicyWorker, out: str, arg=None) -> dict:
    """Off-policy batches: the sampler's log-probs shifted by a known amount, then batches whose
    policy versions break the staleness bound."""
    b = make_batch(seed=5)
    n = len(b.advantages)
    res = {}
    for name, shift in (("capped", -1.0), ("below", 0.5)):   # behavior = old + shift
        old = w.compute_log_prob(b).old_log_probs          # what the update will recompute
        behav = (old + shift * b.response_mask).astype(np.float32)
        res[name] = w.update(replace(b, behavior_log_probs=behav, max_staleness=1,
                                     policy_versions=np.full(n, w.global_step)))
    errors = {}
    for name, versions, bound in (("too_old", np.full(n, w.global_step - 2), 1),
                                  ("from_the_future", np.full(n, w.global_step + 1), 1),
                                  ("sync_bound", np.full(n, w.global_step - 1), 0)):
        try:
            w.update(replace(b, policy_versions=versions, max_staleness=bound))
        except ValueError as exc:
            errors[name] = str(exc)
    res["lagged"] = w.update(replace(b, policy_versions=np.full(n, w.global_step - 1),
                                     max_staleness=1))
    return res | {"errors": errors, "global_step": w.global_step}


AGG_CASES = (("vanilla", "token-sum"), ("vanilla", "seq-mean-token-sum"),
             ("vanilla", "seq-mean-token-mean"), ("vanilla", "seq-mean-token-sum-norm"),
             ("gspo", "seq-mean-token-mean"), ("vanilla", "token-mean"))


def _capture_grads(w: PolicyWorker) -> dict:
    """Filled with the full gradient each time the optimizer steps (every rank steps together,
    so the gathers are safe)."""
    step, grads = w.optim.step, {}

    def capture_then_step(*args, **kwargs):
        grads.update({n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor")
                          else p.grad.clone())      # replicated (a VL merger): a plain tensor
                      for n, p in w.model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    w.optim.step = capture_then_step
    return grads


def _sc_modes(w: PolicyWorker, out: str, arg=None) -> dict:
    """One mini-batch of 7 rows (at world size 2 one rank pads a zero-weight row) under each
    (loss, aggregation), from the same weights: its loss and its full gradient (before the
    optimizer; gradients of equal losses compared after Adam would only show Adam's
    amplification of round-off where a gradient is ~0)."""
    from peer_rl.algos import get_policy_loss_fn

    start = os.path.join(out, "start")
    w.save_checkpoint(start)
    grads = _capture_grads(w)
    results = {}
    for loss_mode, agg in AGG_CASES:
        w.load_checkpoint(start)
        w.policy_loss, w.loss_agg_mode = get_policy_loss_fn(loss_mode), agg
        grads.clear()
        metrics = w.update(grouped_batch(seed=5, n=7) if arg == "grouped"
                           else make_batch(n=7, seed=5))
        results[(loss_mode, agg)] = (dict(grads), metrics["actor/pg_loss"])
    return results


def _sc_shared(w: PolicyWorker, out: str, arg=None) -> dict:
    """The train scenario on grouped rows, every (loss, aggregation) on 7 of them, then an
    update on ESCRAG-R1-shaped rows under the async look-ahead (refined_batch: its old
    log-probs recomputed, the sampler's weights applied): with shared prefixes off, then on,
    from one checkpoint (taken after an update, so both start with the same AdamW moments)."""
    w.update(grouped_batch(seed=9))
    begin = os.path.join(out, "begin")
    w.save_checkpoint(begin, hf_model=False)
    res = {}
    for on in (False, True):
        w.load_checkpoint(begin)
        w.share_prefix = on
        res["on" if on else "off"] = _sc_train(w, out, "grouped") | {
            "modes": _sc_modes(w, out, "grouped")}
        refined = refined_batch()
        res["on" if on else "off"] |= {
            "refined_lp": w.compute_log_prob(refined),
            "refined": w.update(replace(refined, policy_versions=np.full(
                len(refined.input_ids), w.global_step, np.int64)))}
    return res


def _sc_anchor(w: PolicyWorker, out: str, arg=None) -> dict:
    """One optimizer step on the whole batch, from the same weights: anchored on the training
    forward's own log-probs (no separate pass) and on log-probs computed beforehand."""
    start = os.path.join(out, "start")
    w.save_checkpoint(start)
    grads, b = _capture_grads(w), make_batch(n=8, seed=6)
    forwards, token_logp = [], w._token_logp

    def counting(model, *args, **kwargs):           # the policy's forwards, not the reference's
        forwards.append(model is w.model)
        return token_logp(model, *args, **kwargs)

    w._token_logp = counting
    same = w.update(b)
    own, policy_forwards = dict(grads), sum(forwards)
    rows, _ = w._shard_rows(torch.arange(8))
    micro_batches = len(w._micro_batches(rows, torch.as_tensor(b.attention_mask)))
    w.load_checkpoint(start)
    grads.clear()
    given = w.update(replace(b, **asdict(w.compute_log_prob(b))))
    return {"own": own, "given": dict(grads), "own_metrics": same, "given_metrics": given,
            "policy_forwards": policy_forwards, "micro_batches": micro_batches}


def _sc_budget(w: PolicyWorker, out: str, arg=None) -> dict:
    """The token budget the worker runs at, and the forwards 8 rows of up to 64 tokens take."""
    b = make_batch(n=8, t=64)
    rows, _ = w._shard_rows(torch.arange(8))
    mask = torch.as_tensor(b.attention_mask)
    fitted = w.token_budget
    forwards = len(w._micro_batches(rows, mask))
    w.token_budget = 1024                    # the budget as set, before the cap lowered it
    unfitted = len(w._micro_batches(rows, mask))
    w.token_budget = fitted
    return {"budget": fitted, "forwards": forwards, "forwards_at_1024": unfitted,
            "tokens": mask.sum(1).tolist()}


def _sc_load(w: PolicyWorker, out: str, arg=None) -> dict:
    """What the load left on this rank, of the policy and (full weights) the reference: each
    state dict tensor as this rank holds it (its FSDP shard, or the whole tensor where it is
    replicated: the vision tower), every buffer, and whether the output layer still shares
    the embeddings' parameter."""
    from torch.distributed.tensor import DTensor

    models = {"policy": w.model} if w.weights.on else {"policy": w.model, "reference": w.ref}
    return {name: {"local": {k: (v.to_local().clone(), True) if isinstance(v, DTensor)
                             else (v.detach().clone(), False) for k, v in m.state_dict().items()},
                   "buffers": {k: v.detach().clone() for k, v in m.named_buffers()},
                   "tied": m.get_output_embeddings().weight is m.get_input_embeddings().weight}
            for name, m in models.items()}


# the clip-fraction batch: 4 rows of (prompt, response) tokens, each response cut into spans of
# (tokens, delta), delta = log pi - log pi_old the scenario sets; advantages +1, +1, -1, -1
CLIP_ROWS = ((3, ((5, 0.5),)), (4, ((4, 0.1), (4, 0.3))), (2, ((3, -0.5),)), (5, ((6, 1.5),)))
CLIP_ADV = (1.0, 1.0, -1.0, -1.0)


def clip_batch() -> tuple[UpdateBatch, np.ndarray]:
    """The batch of CLIP_ROWS (random token ids) and its (N, T) delta, 0 off the response."""
    rng = np.random.default_rng(11)
    t = 14
    ids, attn, resp = (np.zeros((len(CLIP_ROWS), t), np.int64) for _ in range(3))
    delta = np.zeros((len(CLIP_ROWS), t), np.float32)
    for i, (p, spans) in enumerate(CLIP_ROWS):
        r = sum(n for n, _ in spans)
        ids[i, :p + r] = rng.integers(1, 256, p + r)
        attn[i, :p + r] = 1
        resp[i, p:p + r] = 1
        delta[i, p:p + r] = [d for n, d in spans for _ in range(n)]
    return UpdateBatch(ids, attn, resp, np.array(CLIP_ADV, np.float32)), delta


def _sc_temperature(w: PolicyWorker, out: str, arg=None) -> dict:
    """Log-probs at the SmolLM2 recipes' temperature 0.7, then one optimizer step whose old
    log-probs are those minus a chosen delta per token: the update's own forward (at 0.7 too)
    makes each ratio exp(delta), so its clip fraction and approx KL are known beforehand."""
    b, delta = clip_batch()
    b = replace(b, temperature=0.7)
    lp = w.compute_log_prob(b).old_log_probs
    metrics = w.update(replace(b, old_log_probs=lp - delta, ref_log_prob=lp))
    return {"lp": lp, "metrics": metrics}


SCENARIOS = {"load": _sc_load, "budget": _sc_budget, "anchor": _sc_anchor, "modes": _sc_modes, "train": _sc_train, "shared": _sc_shared, "vl_shared": _sc_vl_shared, "ckpt": _sc_ckpt, "resume": _sc_resume, "learn": _sc_learn,
             "hostile": _sc_hostile, "vl_mixed": _sc_vl_mixed, "async": _sc_async,
             "temperature": _sc_temperature}


def _entry(rank, world_size, port, model_path, scenario, hp, out, arg):
    torch.set_num_threads(1)
    if isinstance(model_path, list):     # each rank its own copy of the model
        model_path = model_path[rank]
    lora = hp.pop("lora", None)          # LoRASettings' keys: the same scenario on adapters
    w = PolicyWorker(rank, world_size, "127.0.0.1", port, model_path, PolicySettings(**hp),
                     seed=SEED, lora_settings=LoRASettings(**lora) if lora else None)
    try:
        res = SCENARIOS[scenario](w, out, arg)
        if isinstance(res, dict):
            res["recomputation"] = w.recomputation()
    finally:
        w.shutdown()
    with open(os.path.join(out, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(res, f)
    # the result is on disk: leave without the interpreter's teardown, where gloo's threads
    # have once aborted the process ("terminate called without an active exception") under load
    os._exit(0)


def run_group(world_size, model_path, scenario, out, arg=None, **hp) -> list[dict]:
    os.makedirs(out, exist_ok=True)
    start_ranks(_entry, (world_size, free_port(), model_path, scenario, {**HP, **hp}, str(out),
                         arg), world_size)
    return rank_results(out, world_size)


def rank_results(out, world_size: int) -> list[dict]:
    """What each spawned rank left in out/rank<r>.pkl, in rank order."""
    results = []
    for r in range(world_size):
        with open(os.path.join(out, f"rank{r}.pkl"), "rb") as f:
            results.append(pickle.load(f))
    return results


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def world1(tiny_model, tmp_path_factory):
    return run_group(1, tiny_model, "train", tmp_path_factory.mktemp("w1"))


@pytest.fixture(scope="module")
def world2(tiny_model, tmp_path_factory):
    # recomputation left to the estimate, which finds the tiny model's activations small
    return run_group(2, tiny_model, "train", tmp_path_factory.mktemp("w2"),
                     gradient_checkpointing="auto")


@pytest.fixture(scope="module")
def ckpt_world2(tiny_model, tmp_path_factory):
    """Two ranks: one step, a checkpoint, a perturbation, the load and the replayed step
    (shared by the round-trip and the world-size-change tests: one spawn, not two)."""
    # files of ~64 KiB a rank, so each rank writes several (what a large model does at 256 MiB)
    return run_group(2, tiny_model, "ckpt", tmp_path_factory.mktemp("ckpt_w2"), arg=64 << 10,
                     ppo_mini_batch_size=8, ppo_epochs=1)


# ---------------------------------------------------------------- tests
def test_log_probs_aligned_and_reference_equal(tiny_model, world2):
    b = make_batch()
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    ids, attn = torch.tensor(b.input_ids), torch.tensor(b.attention_mask)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits
    want = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0] * attn[:, 1:]
    for res in world2:                        # every rank returns the full batch
        lp = res["lp"]
        assert lp.old_log_probs.shape == ids.shape
        assert np.all(lp.old_log_probs[:, 0] == 0)
        np.testing.assert_allclose(lp.old_log_probs[:, 1:], want.numpy(), atol=1e-5)
        np.testing.assert_array_equal(lp.old_log_probs, lp.ref_log_prob)


@pytest.mark.parametrize("route", [dict(use_remove_padding=True, logits_chunk_size=1024),
                                   dict(use_remove_padding=False, logits_chunk_size=0)],
                         ids=["packed-chunked", "padded-plain-logits"])
def test_log_probs_and_the_update_use_the_sampling_temperature(route, tiny_model, tmp_path):
    """At T = 0.7 (the SmolLM2 recipes' rollout.temperature) the policy's log-probs are
    log_softmax(logits / 0.7), on both routes to them (chunked head, plain logits). The update's
    forward divides by T too: its ratio to the given old log-probs is exp(delta) only if it
    does, so its clip fraction and approx KL equal the hand-counted ones below. One mini-batch
    and one epoch: every ratio is taken before the optimizer steps; micro-batches of 3 rows,
    so the token-weighted mean over micro-batches of different sizes is checked too."""
    (r,) = run_group(1, tiny_model, "temperature", tmp_path, ppo_mini_batch_size=4,
                     ppo_micro_batch_size=3, ppo_max_token_len_per_gpu=0, ppo_epochs=1, **route)
    b, _ = clip_batch()
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    ids, attn = torch.tensor(b.input_ids), torch.tensor(b.attention_mask)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].double()

    def token_logp(x):
        return (torch.log_softmax(x, -1).gather(-1, ids[:, 1:, None])[..., 0] * attn[:, 1:]).numpy()

    want, at_1 = token_logp(logits / 0.7), token_logp(logits)
    assert np.abs(want - at_1).max() > 0.05                  # the temperature matters here
    assert np.all(r["lp"][:, 0] == 0)
    np.testing.assert_allclose(r["lp"][:, 1:], want, atol=1e-5)
    # 22 response tokens (5 + 8 + 3 + 6), ratio exp(delta), clip range [0.8, 1.2], dual clip 3:
    # A > 0 is clipped above 1.2: row 0 (e^0.5 = 1.65, 5 tokens), row 1's second span
    # (e^0.3 = 1.35, 4 tokens; e^0.1 = 1.11 is not); A < 0 below 0.8: row 2 (e^-0.5 = 0.61,
    # 3 tokens), not row 3 (e^1.5 = 4.48, held by the dual clip instead: 6 tokens)
    m = r["metrics"]
    assert m["actor/pg_clipfrac"] == pytest.approx((5 + 4 + 3) / 22, abs=1e-6)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(6 / 22, abs=1e-6)
    # verl's approx_kl (ppo_kl): the token mean of log pi_old - log pi = -delta
    kl = -(5 * 0.5 + 4 * 0.1 + 4 * 0.3 + 3 * -0.5 + 6 * 1.5) / 22
    assert m["actor/ppo_kl"] == pytest.approx(kl, abs=1e-4)
    assert m["actor/tokens"] == 22


def from_pretrained(model_path: str):
    """transformers' own load of `model_path` (the oracle), float32."""
    from transformers import AutoModelForImageTextToText

    vision = "vision_config" in (Path(model_path) / "config.json").read_text(encoding="utf-8")
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    return auto.from_pretrained(model_path, dtype=torch.float32)


# two of the four combinations, each process pair ~20-40 s on 2 cores: full weights on the
# vision model (policy and reference, the replicated tower, the rotary buffers) and LoRA on
# the text model (adapters broadcast from rank 0); test_fsdp holds both trees to
# from_pretrained's
@pytest.mark.parametrize("case", ["vision", "text+lora"])
def test_only_rank_0_reads_the_checkpoint_and_every_rank_holds_from_pretrained_weights(
        case, tiny_model, tiny_models, tmp_path):
    """2 ranks, the second given a copy of the model without its weights (config, tokenizer and
    processor only): the load must read no weight there (a rank that loads the checkpoint
    itself fails on it), and the policy's and the reference's full state dicts and every
    buffer (rotary inv_freq is in no state dict) equal from_pretrained's exactly on both ranks,
    the output layer still tied to the embeddings. The vision model's tower is replicated,
    outside FSDP; with LoRA the adapters come from a saved adapter and equal PEFT's own load."""
    from peft import PeftModel

    path = tiny_models["policy"] if case.startswith("vision") else tiny_model
    expected, hp = from_pretrained(path), {}
    if case.endswith("lora"):
        adapter = save_random_adapter(lambda: from_pretrained(path), tmp_path / "adapter",
                                      rank=4, alpha=8.0)
        hp["lora"] = dict(rank=4, lora_alpha=8.0, lora_adapter_path=adapter)
        expected = PeftModel.from_pretrained(expected, adapter).get_base_model()
    no_weights = tmp_path / "no-weights"
    shutil.copytree(path, no_weights, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    ranks = run_group(2, [path, str(no_weights)], "load", tmp_path / "run", **hp)
    want, buffers = expected.state_dict(), dict(expected.named_buffers())
    assert any(".visual." in k for k in want) == case.startswith("vision")
    assert any("lora_A" in k for k in want) == case.endswith("lora")
    assert buffers and not any(k in want for k in buffers)       # buffers no state dict holds
    for rank, res in enumerate(ranks):
        models = [m for m in ("policy", "reference") if m in res]
        assert models == (["policy"] if case.endswith("lora") else ["policy", "reference"])
        for name in models:
            got = res[name]
            assert list(got["local"]) == list(want), (rank, name)
            sharded = {k for k, (_, is_shard) in got["local"].items() if is_shard}
            assert sharded and (sharded != set(want)) == case.startswith("vision")
            differ = [k for k, (t, is_shard) in got["local"].items()   # FSDP2: dim-0 chunks
                      if not torch.equal(t, torch.chunk(want[k], 2)[rank] if is_shard else want[k])]
            assert not differ, f"rank {rank} {name}: {differ}"
            assert got["buffers"].keys() == buffers.keys(), (rank, name)
            differ = [k for k in buffers if not torch.equal(got["buffers"][k], buffers[k])]
            assert not differ, f"rank {rank} {name} buffers: {differ}"
            assert got["tied"], (rank, name)


def initial_weights(model_path: str) -> dict:
    """Initial weights in the exported layout, to show that the update really moved them."""
    return AutoModelForCausalLM.from_pretrained(model_path).state_dict()


def test_world2_matches_world1(tiny_model, world1, world2):
    (r1,), (r2a, r2b) = world1, world2
    assert r2b["weights"] is None and r2a["weights"] is not None
    diff = max_diff(r1["weights"], r2a["weights"])
    moved = max_diff(r1["weights"], initial_weights(tiny_model))
    print(f"\nworld2-vs-world1 max weight diff {diff:.3e} (update moved weights by {moved:.3e}); "
          f"update step world1 {r1['update_s']:.3f}s world2 {r2a['update_s']:.3f}s")
    assert moved > 1e-3 and diff < 1e-5
    assert r2a["metrics"] == r2b["metrics"]   # all-reduced: identical on both ranks
    keys = ("actor/pg_loss", "actor/kl_loss", "actor/pg_clipfrac", "actor/entropy",
            "actor/grad_norm", "actor/ppo_kl", "actor/lr", "actor/tokens")
    for m1, m2 in ((r1["metrics"], r2a["metrics"]), (r1["metrics7"], r2a["metrics7"])):
        for k in keys:
            assert m1[k] == pytest.approx(m2[k], rel=1e-4, abs=1e-6), k
    assert m2["actor/lr"] == HP["lr"] and m2["timing_s/update_total"] > 0
    assert r2a["health"]["world_size"] == 2 and r2b["health"]["rank"] == 1


def test_bfloat16_compute_keeps_float32_master_weights(tiny_model, world1, tmp_path):
    """actor.dtype=bfloat16 at world size 2: the forwards compute in bfloat16 (log-probs and
    the trained weights move off the float32 run's by bfloat16's round-off, 2^-8 relative, not
    float32's ~1e-7), while the weights the optimizer holds and exports stay float32 and the
    step lands near the float32 one. A worker that ignored the setting would match world1
    to ~1e-5 (test_world2_matches_world1)."""
    ra, rb = run_group(2, tiny_model, "train", tmp_path, dtype="bfloat16")
    (r1,) = world1
    assert ra["recomputation"]["dtype"] == rb["recomputation"]["dtype"] == "bfloat16"
    assert "; compute bfloat16 (as set); " in ra["recomputation"]["line"]
    assert r1["recomputation"]["dtype"] == "float32"
    lp16, lp32 = ra["lp"].old_log_probs, r1["lp"].old_log_probs
    gap = float(np.abs(lp16 - lp32).max())
    print(f"\nbfloat16 vs float32 log-prob max gap {gap:.3g}")
    assert 1e-4 < gap < 0.05
    assert np.array_equal(ra["lp"].old_log_probs, ra["lp"].ref_log_prob)   # one model, one dtype
    assert all(v.dtype == torch.float32 for v in ra["weights"].values())
    # the steps point the same way (Adam turns bfloat16's noise on near-zero gradients into
    # full-size moves, so elementwise closeness is not expected)
    init = initial_weights(tiny_model)
    d32, d16 = (torch.cat([(r["weights"][k] - init[k]).flatten() for k in init])
                for r in (r1, ra))
    cos = float(d32 @ d16 / (d32.norm() * d16.norm()))
    print(f"cosine of the bfloat16 and float32 runs' weight changes {cos:.3f}")
    assert 0.9 < cos < 1 - 1e-6
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert np.isfinite(ra["metrics"][k]), k
    assert ra["metrics"]["actor/grad_norm"] == pytest.approx(r1["metrics"]["actor/grad_norm"],
                                                             rel=0.05)


def test_the_padding_share_counts_the_positions_forwards_computed_beyond_the_rows(world1,
                                                                                  world2):
    """Rows of 16 and 8 tokens: one rank computes both at width 16 (32 positions, 24 real:
    a quarter is padding, in each of the two epochs); two ranks take one row each, each cut
    to its own length (no padding)."""
    assert world1[0]["padded"]["actor/padding_share"] == pytest.approx(0.25)
    assert [r["padded"]["actor/padding_share"] for r in world2] == [0.0, 0.0]


def test_each_update_reports_the_largest_peak_resident_memory_of_any_rank(world2):
    """perf/max_rss_gib: the same on both ranks (the max over them), never falling from one
    update to the next, and at most the peak the ranks' health reports after both updates."""
    first = [r["metrics"]["perf/max_rss_gib"] for r in world2]
    second = [r["metrics7"]["perf/max_rss_gib"] for r in world2]
    assert first[0] == first[1] and second[0] == second[1]
    assert 0.1 < first[0] <= second[0]
    assert second[0] <= max(r["health"]["peak_rss_bytes"] for r in world2) / 2**30
    line = world2[0]["recomputation"]["line"]
    assert "GiB resident at most while loading" in line


def test_every_loss_and_aggregation_gives_the_one_batch_gradient_at_world_sizes_1_and_2(
        tiny_model, tmp_path):
    """The one-batch gradient (world 1, one forward) against the same batch accumulated over
    four 2-row micro-batches (world 1) and averaged over two ranks, one of which pads a
    zero-weight row (world 2): equal in every mode, because each micro-batch's share is taken
    against the whole mini-batch's tokens and sequences."""
    assert_every_mode_gives_the_one_batch_gradient(tiny_model, tmp_path)


def assert_every_mode_gives_the_one_batch_gradient(model_path, tmp_path, **hp) -> dict:
    """The test above, for any policy settings (`hp`: LoRA's too); returns the one-batch
    gradients by (loss, aggregation)."""
    one_pass = dict(ppo_mini_batch_size=8, ppo_epochs=1, grad_clip=1e9, **hp)
    (whole,) = run_group(1, model_path, "modes", tmp_path / "whole", **one_pass)
    (micro,) = run_group(1, model_path, "modes", tmp_path / "micro", ppo_micro_batch_size=2,
                         ppo_max_token_len_per_gpu=0, **one_pass)
    ranks = run_group(2, model_path, "modes", tmp_path / "ranks", **one_pass)[0]
    for case in AGG_CASES:
        (g, loss) = whole[case]
        scale = max(v.abs().max().item() for v in g.values())
        assert scale > 1e-4, case                        # a gradient to compare
        for other in (micro, ranks):
            (g2, loss2) = other[case]
            assert max_diff(g, g2) < 1e-5 * scale, case
            assert loss2 == pytest.approx(loss, rel=1e-5, abs=1e-7), case
    # the modes are not one another: the same batch gives other gradients
    token_mean = whole[("vanilla", "token-mean")][0]
    for case in AGG_CASES[:-1]:
        assert max_diff(whole[case][0], token_mean) > 1e-3 * scale, case
    return {case: whole[case][0] for case in AGG_CASES}


def test_one_step_updates_anchor_on_their_own_forward_with_the_same_gradient(tiny_model,
                                                                            tmp_path):
    """ppo_epochs=1 and a mini-batch that holds the batch: the old policy is the policy as it
    stands, so the update skips the separate no-grad pass and takes the ratio around its own
    forward (detached). Same gradient and loss as with the old log-probs computed first."""
    res = run_group(2, tiny_model, "anchor", tmp_path, ppo_mini_batch_size=8, ppo_epochs=1,
                    grad_clip=1e9)[0]
    scale = max(v.abs().max().item() for v in res["own"].values())
    assert scale > 1e-4 and max_diff(res["own"], res["given"]) < 1e-5 * scale
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/entropy"):
        assert res["own_metrics"][k] == pytest.approx(res["given_metrics"][k], rel=1e-5,
                                                      abs=1e-7), k
    assert res["own_metrics"]["actor/ppo_kl"] == 0.0      # the ratio is exactly 1
    # the policy ran forward once per training micro-batch: no separate pass before them
    assert res["policy_forwards"] == res["micro_batches"] >= 1


def test_activation_checkpointing_changes_no_weight_or_loss(tiny_model, world2, tmp_path):
    """actor.gradient_checkpointing: the same update (two ranks, two mini-batches) with every
    decoder layer recomputed in backward gives the same weights and metrics."""
    (gc_a, _) = run_group(2, tiny_model, "train", tmp_path, gradient_checkpointing=True)
    plain = world2[0]
    assert gc_a["recomputation"]["on"] and "gradient_checkpointing=true" in \
        gc_a["recomputation"]["line"]
    # auto, on the tiny model with this machine's memory: off, and the estimate said
    assert not plain["recomputation"]["on"]
    assert plain["recomputation"]["line"].startswith("recomputation off (auto: activations ~")
    assert gc_a["layer_calls"] == 2 * plain["layer_calls"] > 0     # each recomputed in backward
    assert max_diff(plain["weights"], gc_a["weights"]) < 1e-6
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy"):
        assert gc_a["metrics"][k] == pytest.approx(plain["metrics"][k], rel=1e-6, abs=1e-9), k


def test_the_token_budget_is_lowered_until_a_micro_batch_fits_the_activation_cap(tiny_model,
                                                                                  tmp_path):
    """The test model (h 64, MLP 128, 2 heads, full weights, float32) keeps per token and layer
    Q, K, V, the attention output (4 x 64), gate, up, activation (3 x 128), the training
    linear layers' inputs (3 x 64 + 128) and both norms' outputs (2 x 64): 1,088 values x 4 =
    4,352 bytes, + both norms' float32 inputs 512 + a log-sum-exp per head 8 = 4,872; x 2
    layers = 9,744 bytes a token. A 2.5 MiB cap (2,621,440 bytes) fits 256 tokens (2,494,464),
    not 384 (3,741,696). 8 padded rows of at most 64 tokens (<= 512) are one forward at 1,024,
    more at 256."""
    (res,) = run_group(1, tiny_model, "budget", tmp_path, ppo_max_token_len_per_gpu=1024,
                       micro_batch_activation_gib=2.5 / 1024)
    assert res["budget"] == 256
    assert len(res["tokens"]) == 8 and 256 < sum(res["tokens"]) <= 512, res["tokens"]
    assert res["forwards_at_1024"] == 1                   # the whole batch in one at 1,024
    # at 256 no micro-batch may hold more: at least ceil(tokens / 256) forwards
    assert res["forwards"] >= -(-sum(res["tokens"]) // 256) >= 2
    assert res["recomputation"]["line"].startswith(
        "token budget 256 (actor.micro_batch_activation_gib=0.00244141: ~0.00 GiB of "
        "activations a micro-batch; 1024 would keep ~0.01 GiB); recomputation off")


def assert_same_training(got: dict, want: dict) -> None:
    """Two "train" scenarios agree: log-probs (policy and reference), the two updates' losses,
    gradient norms and token counts, and the weights after them."""
    np.testing.assert_allclose(got["lp"].old_log_probs, want["lp"].old_log_probs, atol=1e-5)
    np.testing.assert_allclose(got["lp"].ref_log_prob, want["lp"].ref_log_prob, atol=1e-5)
    for m in ("metrics", "metrics7"):
        for k in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
                  "actor/ppo_kl", "actor/tokens"):
            assert got[m][k] == pytest.approx(want[m][k], rel=1e-5, abs=1e-7), (m, k)
    assert max_diff(got["weights"], want["weights"]) < 1e-5


def test_lean_update_equals_the_plain_one(tiny_model, tmp_path):
    """Chunked log-probs (3 positions at a time: many chunks per row) and token-budget
    micro-batches cut to their longest row (40 tokens: 2-3 rows per forward, a different
    count of rows each time) against full logits over fixed 2-row micro-batches padded to the
    batch: the same losses, gradient norms and weights."""
    plain = run_group(2, tiny_model, "train", tmp_path / "plain", logits_chunk_size=0,
                      ppo_max_token_len_per_gpu=0)[0]
    lean = run_group(2, tiny_model, "train", tmp_path / "lean", logits_chunk_size=3,
                     ppo_max_token_len_per_gpu=40)[0]
    assert_same_training(lean, plain)
    assert max_diff(lean["weights"], initial_weights(tiny_model)) > 1e-3


@pytest.mark.parametrize("lora", [None, dict(rank=8)], ids=["full", "lora"])
def test_shared_prefixes_train_exactly_as_whole_rows(tiny_model, tmp_path, lora):
    """Shared prefixes off and on (one process, from one checkpoint) on GRPO-shaped rows (3
    prompts x 4 replies), packed, two ranks, a 40-token budget (a group's rows split over
    micro-batches and ranks), 3-position logit chunks, full weights and LoRA adapters: the same
    log-probs, losses, gradient norms and weights after two updates (the second of 7 rows: a
    rank pads a zero-weight row), and the same gradient in every (loss, aggregation); fewer
    tokens forwarded. Without sharing every row runs whole: old, reference and two epochs'
    training passes, 4 x the batch's tokens."""
    common = dict(use_remove_padding=True, logits_chunk_size=3, ppo_max_token_len_per_gpu=40,
                  grad_clip=1e9, shared_prefix="true", **({"lora": lora} if lora else {}))
    res = run_group(2, tiny_model, "shared", tmp_path, **common)[0]
    on, off = res["on"], res["off"]
    assert_same_training(on, off)
    for case in AGG_CASES:
        (g_on, loss_on), (g_off, loss_off) = on["modes"][case], off["modes"][case]
        scale = max(v.abs().max().item() for v in g_off.values())
        assert scale > 1e-4 and max_diff(g_on, g_off) < 1e-5 * scale, case
        assert loss_on == pytest.approx(loss_off, rel=1e-5, abs=1e-7), case
    tokens = int(grouped_batch().attention_mask.sum())
    assert off["metrics"]["actor/forward_tokens"] == 4 * tokens
    assert on["metrics"]["actor/forward_tokens"] < 0.8 * off["metrics"]["actor/forward_tokens"]
    # ESCRAG-R1's refined prompts (alike up to the dialogue, rows of a group apart) under the
    # async look-ahead: the same log-probs and update; the dialogue runs once per group
    for k in ("old_log_probs", "ref_log_prob"):
        np.testing.assert_allclose(getattr(on["refined_lp"], k), getattr(off["refined_lp"], k),
                                   atol=1e-5)
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
              "actor/ppo_kl", "actor/tokens", "async/behavior_weight_mean"):
        assert on["refined"][k] == pytest.approx(off["refined"][k], rel=1e-5, abs=1e-7), k
    refined = int(refined_batch().attention_mask.sum())
    assert off["refined"]["actor/forward_tokens"] == 4 * refined
    # 558 of 784 when measured; rows kept together by prompt alone (not by group) forward 706
    assert on["refined"]["actor/forward_tokens"] < 0.85 * off["refined"]["actor/forward_tokens"]


def test_export_loads_strictly(tiny_model, world2):
    sd = world2[0]["weights"]
    ref = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert set(sd) == set(ref.state_dict())
    fresh = Qwen2ForCausalLM(ref.config)
    fresh.load_state_dict(sd, strict=True)
    for k, v in fresh.state_dict().items():        # the model now holds exactly the export
        assert torch.equal(v, sd[k]), k
    # the export writes the tied pair as two equal tensors (not one aliased to itself), and
    # they are the trained weights, not the start's
    assert sd["lm_head.weight"].data_ptr() != sd["model.embed_tokens.weight"].data_ptr()
    assert torch.equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"])
    assert not torch.equal(sd["model.embed_tokens.weight"], ref.model.embed_tokens.weight)


def test_kl_zero_and_checkpoint_round_trip(ckpt_world2):
    r0 = ckpt_world2[0]
    first = r0["first"]
    assert abs(first["actor/kl_loss"]) < 1e-6 and abs(first["actor/ppo_kl"]) < 1e-6
    assert first["actor/pg_clipfrac"] == 0.0
    assert max_diff(r0["saved"], r0["perturbed"]) > 1e-4
    assert max_diff(r0["saved"], r0["loaded"]) == 0.0
    assert max_diff(r0["perturbed"], r0["replayed"]) < 1e-6   # optimizer state + step restored
    assert r0["extra"] == {"global_step": 1, "world_size": 2, "lora_rank": 0}
    # both ranks wrote their own slices, in several files each (~64 KiB a rank here: the
    # fixture's budget), the sharding in each file's header
    shards = sorted(f for f in os.listdir(os.path.join(r0["ckpt"], "dcp"))
                    if f.endswith(".safetensors"))
    by_rank = {r: [f for f in shards if f.startswith(f"shard-{r + 1:05d}-")] for r in (0, 1)}
    assert len(shards) == len(by_rank[0]) + len(by_rank[1]), shards
    assert len(by_rank[0]) == len(by_rank[1]) > 1, shards
    from safetensors import safe_open
    names = []
    for f in shards:
        with safe_open(os.path.join(r0["ckpt"], "dcp", f), "pt") as fh:
            names += list(fh.keys())
            assert fh.metadata()                  # JSON sharding info, not a pickle
    assert any(n.startswith("optim/") and n.endswith("/exp_avg") for n in names)
    assert any(n.startswith("model/") for n in names)
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(r0["ckpt"], "model"))
    saved = r0["saved"]
    for k, v in hf.state_dict().items():
        assert torch.equal(v, saved[k]), k


def test_checkpoint_written_at_world_2_resumes_at_world_1(tiny_model, ckpt_world2, tmp_path):
    """actor.world_size may change between runs: the sharded checkpoint two ranks wrote loads
    into one rank, and the next step there equals the next step the two ranks took."""
    two = ckpt_world2[0]
    one = run_group(1, tiny_model, "resume", tmp_path / "w1", arg=two["ckpt"],
                    ppo_mini_batch_size=8, ppo_epochs=1)[0]
    assert one["extra"]["world_size"] == 2 and one["extra"]["global_step"] == 1
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/ppo_kl"):
        assert one["metrics"][k] == pytest.approx(two["replayed_metrics"][k], rel=1e-4, abs=1e-7), k
    # the step moved the weights, and both runs moved them the same way (AdamW's moments came
    # through: without them the first step after a load would differ)
    assert max_diff(one["weights"], two["loaded"]) > 1e-4
    assert max_diff(one["weights"], two["replayed"]) < 1e-5


def test_positive_advantage_log_prob_increases(tiny_model, tmp_path):
    r0, _ = run_group(2, tiny_model, "learn", tmp_path, lr=1e-2, kl_loss_coef=0.0,
                      entropy_coeff=0.0, grad_clip=10.0)
    b = make_batch(seed=2)
    mask = (b.response_mask * b.attention_mask).astype(bool)
    mask[:, 0] = False

    def seq_mean(lp):
        return (lp * mask).sum(1) / mask.sum(1)

    gain = seq_mean(r0["after"]) - seq_mean(r0["before"])
    adv = b.advantages
    print(f"\nupdate step times at world 2: {[round(t, 3) for t in r0['times']]}; "
          f"pg_loss {[round(m['actor/pg_loss'], 4) for m in r0['metrics']]}")
    assert float((adv * gain).sum()) > 0
    assert gain[adv > 0].mean() > 0 > gain[adv < 0].mean()
    assert r0["metrics"][-1]["actor/pg_loss"] < r0["metrics"][0]["actor/pg_loss"]


@pytest.mark.e2e
def test_ray_actors_match_world1(tiny_model, world1, monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        RemotePolicy = ray.remote(num_cpus=1)(PolicyWorker)
        port = free_port()
        actors = [RemotePolicy.remote(r, 2, "127.0.0.1", port, tiny_model,
                                            PolicySettings(**HP), seed=SEED) for r in range(2)]
        batch = ray.put(make_batch())
        metrics = ray.get([a.update.remote(batch) for a in actors])
        ray.get([a.update.remote(make_batch(n=7, seed=4)) for a in actors])
        blobs = ray.get([a.full_state.remote() for a in actors])
        health = ray.get([a.health.remote() for a in actors])
        ray.get([a.shutdown.remote() for a in actors])
    finally:
        ray.shutdown()
    assert metrics[0] == metrics[1] and blobs[1] is None
    assert metrics[0]["actor/grad_norm"] == pytest.approx(world1[0]["metrics"]["actor/grad_norm"], rel=1e-4)
    assert max_diff(blobs[0], world1[0]["weights"]) < 1e-5
    assert [h["rank"] for h in health] == [0, 1] and health[0]["pid"] != health[1]["pid"]


def test_a_pickled_object_in_a_checkpoint_is_refused_not_run(tiny_model, tmp_path):
    """Checkpoints hold safetensors only: shards replaced by crafted pickles fail to load as
    not-safetensors and never run."""
    res = run_group(1, tiny_model, "hostile", tmp_path)[0]
    assert res["shards"] and res["error"] is not None
    assert res["error"].startswith("ValueError: ") and "ckpt/dcp: the sharded checkpoint " \
        "cannot be read" in res["error"] and "header" in res["error"], res["error"]
    assert res["ran"] is False


def test_shared_vision_prompts_encode_each_image_once_and_train_as_whole_rows(tiny_models,
                                                                              tmp_path):
    """The tiny VL policy on vl_grouped_batch, packed, with and without shared prefixes: the
    same log-probs and the same gradient (compared before Adam, which turns round-off in a
    near-zero gradient into a whole step); shared, the vision tower encodes each of the 2 x 2
    frames once in the two passes (policy, reference) instead of once per row, and the rows
    showing the happy frames never take the sad rows' prompt (equal tokens, other images)."""
    hp = dict(ppo_mini_batch_size=7, ppo_micro_batch_size=7, ppo_epochs=1, lr=1e-2,
              freeze_vision_tower=True, use_remove_padding=True, grad_clip=1e9)
    off = run_group(1, tiny_models["policy"], "vl_shared", tmp_path / "off",
                    shared_prefix="false", **hp)[0]
    on = run_group(1, tiny_models["policy"], "vl_shared", tmp_path / "on",
                   shared_prefix="true", **hp)[0]
    np.testing.assert_allclose(on["lp"], off["lp"], atol=1e-5)
    scale = max(v.abs().max().item() for v in off["grads"].values())
    assert scale > 1e-4 and max_diff(on["grads"], off["grads"]) < 1e-5 * scale
    # after an AdamW step at lr 1e-2 (which turns round-off in a near-zero gradient into a
    # whole step): log-probs near -8 agree to ~1e-5 of their size (one of 231 differed by
    # 1.1e-4 on a CPU without AVX512-BF16, 2026-12-07)
    np.testing.assert_allclose(on["after"], off["after"], atol=1e-4, rtol=1e-5)
    assert float(np.abs(off["after"] - off["lp"]).max()) > 1e-3      # the update did something
    # one frame's patches: 5 visual rows x 2 frames unshared, 2 groups x 2 frames shared; the
    # compute_log_prob pass runs the policy and the reference
    per_frame = off["patches"] / (2 * 5 * 2)
    assert per_frame == int(per_frame) > 0
    assert on["patches"] == 2 * 2 * 2 * per_frame
    assert on["metrics"]["actor/forward_tokens"] < off["metrics"]["actor/forward_tokens"]


@pytest.mark.e2e
def test_vl_ranks_with_and_without_images_stay_in_step(tiny_models, tmp_path):
    """2 FSDP2 ranks of the tiny VL policy where one rank's rows have frames and the other's
    do not: the group does not hang (every rank runs the vision tower), and it trains exactly as
    one rank holding the whole batch does."""
    hp = dict(ppo_mini_batch_size=4, ppo_micro_batch_size=1, ppo_epochs=1, lr=1e-2,
              freeze_vision_tower=True, ppo_max_token_len_per_gpu=0)
    one = run_group(1, tiny_models["policy"], "vl_mixed", tmp_path / "w1", **hp)[0]
    two = run_group(2, tiny_models["policy"], "vl_mixed", tmp_path / "w2", **hp)
    np.testing.assert_allclose(two[0]["lp"], one["lp"], atol=1e-5)
    np.testing.assert_allclose(two[1]["lp"], one["lp"], atol=1e-5)
    # Adam at lr 1e-2 moves each weight by ~1e-2 whatever the gradient's size, so float noise in
    # near-zero gradients shows up in the weights; a rank's gradient missing or counted twice
    # would move them by a whole step
    assert max_diff(two[0]["weights"], one["weights"]) < 1e-4
    np.testing.assert_allclose(two[0]["after"], one["after"], atol=1e-4)
    assert float(np.abs(one["after"] - one["lp"]).max()) > 1e-3      # the update did something


def test_checkpointed_layers_recompute_their_forward_in_backward(tiny_model):
    """Each decoder layer's forward runs twice per step under actor.gradient_checkpointing (the
    forward, then the recompute in backward) and once without; gradients are equal."""
    from peer_rl.workers.fsdp import checkpoint_layers, decoder_layers

    def run(checkpointed: bool):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
        calls = [0]
        for layer in decoder_layers(model):
            inner = layer.forward

            def counted(*a, _inner=inner, **kw):
                calls[0] += 1
                return _inner(*a, **kw)
            layer.forward = counted
        if checkpointed:
            assert checkpoint_layers(model) == len(decoder_layers(model)) > 0
        ids = torch.tensor([list(range(3, 40))])
        model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()
        return calls[0], {n: p.grad.clone() for n, p in model.named_parameters()}

    n_plain, g_plain = run(False)
    n_ckpt, g_ckpt = run(True)
    assert n_ckpt == 2 * n_plain
    assert max((g_plain[k] - g_ckpt[k]).abs().max().item() for k in g_plain) < 1e-6


def test_off_policy_batches_are_weighted_and_the_staleness_bound_is_enforced(tiny_model,
                                                                               tmp_path):
    """One optimizer step per update, so the clipped ratio is exactly 1 when the loss is taken
    (old log-probs recomputed from the same weights): the policy loss is then the behaviour
    weight times the token-mean of -A, worked out here from the batch alone."""
    (r,) = run_group(1, tiny_model, "async", tmp_path, ppo_mini_batch_size=8,
                     ppo_micro_batch_size=8, ppo_epochs=1, behavior_weight_cap=2.0)
    b = make_batch(seed=5)
    mask = (b.response_mask * b.attention_mask).astype(np.float64)
    mask[:, 0] = 0.0
    tokens = mask.sum(1)
    neg_adv_token_mean = float((-b.advantages * tokens).sum() / tokens.sum())
    # behaviour log-probs 1 below: weight e^1 capped at 2 on every token
    assert r["capped"]["async/behavior_weight_mean"] == pytest.approx(2.0)
    assert r["capped"]["async/behavior_weight_capped"] == pytest.approx(1.0)
    assert r["capped"]["actor/pg_loss"] == pytest.approx(2.0 * neg_adv_token_mean, abs=1e-6)
    # 0.5 above: weight e^-0.5, not capped
    assert r["below"]["async/behavior_weight_mean"] == pytest.approx(np.exp(-0.5), rel=1e-5)
    assert r["below"]["async/behavior_weight_capped"] == 0.0
    assert r["below"]["actor/pg_loss"] == pytest.approx(np.exp(-0.5) * neg_adv_token_mean,
                                                        abs=1e-6)
    assert r["below"]["async/staleness_max"] == 0.0
    # versions outside [step - bound, step] are refused before anything changes
    assert set(r["errors"]) == {"too_old", "from_the_future", "sync_bound"}
    assert "update 3: samples drawn by policy versions [0], but this policy has 2 update(s) " \
           "and the staleness bound is 1" in r["errors"]["too_old"]
    assert "versions [3]" in r["errors"]["from_the_future"]
    assert "bound is 0" in r["errors"]["sync_bound"]
    assert r["lagged"]["async/staleness_max"] == 1.0 and r["global_step"] == 3


def test_packed_rows_train_as_the_padded_ones(tiny_model, world1, world2, tmp_path):
    """actor.use_remove_padding: each micro-batch runs as one row of its rows' real tokens
    (rows of 5-16 tokens, budget 40 real tokens: 2-6 rows a forward, each row attending only to
    itself) against right-padded micro-batches, at one rank and at two: the same log-probs,
    losses, gradient norms and weights, and no padded position computed."""
    for padded in (world1, world2):
        packed = run_group(len(padded), tiny_model, "train", tmp_path / str(len(padded)),
                           use_remove_padding=True, ppo_max_token_len_per_gpu=40)
        assert_same_training(packed[0], padded[0])
        # the 16- and 8-token rows: padded on one rank a quarter of the positions (the test
        # above); packed none
        assert [r["padded"]["actor/padding_share"] for r in packed] == [0.0] * len(packed)


def test_packed_vision_rows_keep_their_image_positions(tiny_models, tmp_path):
    """The tiny VL policy (multimodal RoPE: image tokens take positions from the image grid):
    two rows with two frames each and two text rows packed into one forward give the padded
    forward's log-probs and the same update."""
    hp = dict(ppo_mini_batch_size=4, ppo_micro_batch_size=4, ppo_epochs=1, lr=1e-2,
              freeze_vision_tower=True, ppo_max_token_len_per_gpu=0)
    padded = run_group(1, tiny_models["policy"], "vl_mixed", tmp_path / "padded", **hp)[0]
    packed = run_group(1, tiny_models["policy"], "vl_mixed", tmp_path / "packed",
                       use_remove_padding=True, **{**hp, "ppo_max_token_len_per_gpu": 4096})[0]
    np.testing.assert_allclose(packed["lp"], padded["lp"], atol=1e-5)
    assert max_diff(packed["weights"], padded["weights"]) < 1e-4
    np.testing.assert_allclose(packed["after"], padded["after"], atol=1e-4)
