"""LoRA policies (peer_rl.workers.lora) on real FSDP2 gloo ranks, against PEFT's own model outside FSDP.

The worker starts from a saved PEFT adapter whose B is not zero (a fresh adapter has B = 0, so
the gradient of A would be 0 and the adapters would not change the log-probs), which also runs
model.lora.lora_adapter_path. The oracle is PEFT's PeftModel on the plain HF model in this
process, with the GRPO loss at ratio 1 and the low-variance KL written out by hand, and the
reference log-probs from the plain base model (no PEFT at all).
"""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from peer_rl.config.worker_settings import LoRASettings, PolicySettings
from lora_util import save_random_adapter
from spawn_util import start_ranks
from test_policy import (HP, SEED, assert_every_mode_gives_the_one_batch_gradient,  # noqa: F401
                         assert_same_training, free_port, make_batch, max_diff, rank_results,
                         run_group, tiny_model)

RANK, ALPHA = 4, 8.0
# one optimizer step over the whole 8-row batch, micro-batches of 2, a KL term, no clipping
LORA_HP = {**HP, "ppo_mini_batch_size": 8, "ppo_epochs": 1, "kl_loss_coef": 0.1,
           "entropy_coeff": 0.0, "grad_clip": 1e9, "lr": 1e-2}
PREFIX = "base_model.model."     # PeftModel's names around the HF model's


@pytest.fixture(scope="module")
def adapter_dir(tiny_model, tmp_path_factory) -> str:
    """A PEFT adapter on every linear layer with random, non-zero A and B."""
    return save_random_adapter(lambda: AutoModelForCausalLM.from_pretrained(tiny_model),
                               tmp_path_factory.mktemp("adapter"), RANK, ALPHA)


# ---------------------------------------------------------------- spawned scenario (per rank)
def _sc_step(w, out: str, ckpt_from: str | None) -> dict:
    """Log-probs, then one update: the full adapter gradient the optimizer receives, and the
    adapted model's own state before and after; then the checkpoint's round trip, or (with
    `ckpt_from`, a checkpoint another world size wrote after the same first update) its load and
    the update that run took next."""
    from peer_rl.workers import fsdp

    b = make_batch()
    lp = w.compute_log_prob(b)
    step, grads = w.optim.step, {}

    def capture_then_step(*args, **kwargs):
        grads.update({n: p.grad.full_tensor().clone() for n, p in w.model.named_parameters()
                      if p.grad is not None})
        return step(*args, **kwargs)

    w.optim.step = capture_then_step
    before = {k: v.clone() for k, v in fsdp.full_state_dict(w.model).items()}
    w.update(b)
    res = {"lp": lp, "grads": dict(grads), "before": before,
           "after": {k: v.clone() for k, v in fsdp.full_state_dict(w.model).items()},
           "merged": w.full_state(),
           "optimized": [n for n, p in w.model.named_parameters()
                         if any(p is q for g in w.optim.param_groups for q in g["params"])],
           "line": w.recomputation()["line"]}
    if ckpt_from:
        res["extra"] = w.load_checkpoint(ckpt_from)
        res["loaded"] = w.full_state()
        w.update(b)
        return res | {"resumed": w.full_state()}
    ckpt = os.path.join(out, "ckpt")
    w.save_checkpoint(ckpt)
    res |= {"ckpt": ckpt, "saved": w.full_state()}
    w.update(b)
    res["perturbed"] = w.full_state()
    w.load_checkpoint(ckpt)
    res["loaded"] = w.full_state()
    w.update(b)
    return res | {"replayed": w.full_state()}


def _entry(rank, world_size, port, model_path, adapter, out, ckpt_from):
    from peer_rl.workers.policy import PolicyWorker

    torch.set_num_threads(1)
    w = PolicyWorker(rank, world_size, "127.0.0.1", port, model_path,
                     PolicySettings(**LORA_HP), seed=SEED,
                     lora_settings=LoRASettings(rank=RANK, lora_alpha=ALPHA,
                                                lora_adapter_path=adapter))
    try:
        res = _sc_step(w, out, ckpt_from)
    finally:
        w.shutdown()
    with open(os.path.join(out, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(res, f)
    os._exit(0)


def run_lora(world_size: int, model_path: str, adapter: str, out, ckpt_from=None) -> list[dict]:
    os.makedirs(out, exist_ok=True)
    start_ranks(_entry, (world_size, free_port(), model_path, adapter, str(out), ckpt_from),
                world_size)
    return rank_results(out, world_size)


@pytest.fixture(scope="module")
def lora_world2(tiny_model, adapter_dir, tmp_path_factory):
    return run_lora(2, tiny_model, adapter_dir, tmp_path_factory.mktemp("lora_w2"))


@pytest.fixture(scope="module")
def lora_world1(tiny_model, adapter_dir, lora_world2, tmp_path_factory):
    """One rank: the same first update, then the two ranks' checkpoint resumed."""
    return run_lora(1, tiny_model, adapter_dir, tmp_path_factory.mktemp("lora_w1"),
                    ckpt_from=lora_world2[0]["ckpt"])


# ---------------------------------------------------------------- the oracle
def _token_logp(model, ids, attn) -> torch.Tensor:
    """Token-aligned log p(ids[t] | ids[:t]) of a plain model, column 0 zero."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(lp, (1, 0)) * attn


def base_logp(model_path: str, b) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        return _token_logp(model, torch.tensor(b.input_ids), torch.tensor(b.attention_mask))


def peft_gradient(model_path: str, adapter: str, b) -> dict[str, torch.Tensor]:
    """PEFT's model, no FSDP: the gradient of token-mean(-A * ratio) + c * token-mean(KL) at
    ratio 1, KL = exp(ref - logp) - (ref - logp) - 1 (Schulman's k3), ref = the base model."""
    from peft import PeftModel

    ids, attn = torch.tensor(b.input_ids), torch.tensor(b.attention_mask)
    ref = base_logp(model_path, b)
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval(), adapter,
        is_trainable=True)
    logp = _token_logp(model, ids, attn)
    mask = torch.tensor(b.response_mask * b.attention_mask, dtype=torch.float32)
    mask[:, 0] = 0
    adv = torch.tensor(b.advantages)[:, None]
    ratio = torch.exp(logp - logp.detach())
    d = ref - logp
    kl = (torch.exp(d) - d - 1).clamp(-10, 10)
    loss = ((-adv * ratio + LORA_HP["kl_loss_coef"] * kl) * mask).sum() / mask.sum()
    loss.backward()
    return {n[len(PREFIX):]: p.grad for n, p in model.named_parameters() if p.requires_grad}


# ---------------------------------------------------------------- tests
@pytest.mark.e2e
def test_adapter_gradient_equals_peft_outside_fsdp(tiny_model, adapter_dir, lora_world1):
    (res,) = lora_world1
    want = peft_gradient(tiny_model, adapter_dir, make_batch())
    got = res["grads"]
    assert set(got) == set(want) and len(want) == 2 * 7 * 2     # A and B, 7 linears, 2 layers
    assert all("lora_" in n for n in got)
    scale = max(g.abs().max().item() for g in want.values())
    assert scale > 1e-3                                          # a gradient worth comparing
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-6 * scale, msg=n)
    # the adapter and the optimizer: exactly the adapter parameters are optimized
    assert sorted(res["optimized"]) == sorted(want)


@pytest.mark.e2e
def test_reference_log_probs_are_the_base_models(tiny_model, lora_world1, lora_world2):
    want = base_logp(tiny_model, make_batch()).numpy()
    for res in (*lora_world1, *lora_world2):
        lp = res["lp"]
        np.testing.assert_allclose(lp.ref_log_prob, want, atol=1e-6, rtol=0)
        # negative control: the policy (adapters on) is not the base model
        assert np.abs(lp.old_log_probs - want).max() > 1e-2
    assert "reference: the policy with its LoRA adapters off" in lora_world1[0]["line"]
    assert "MiB of weights a rank not held" in lora_world1[0]["line"]


@pytest.mark.e2e
def test_world2_adapter_gradient_matches_world1(lora_world1, lora_world2):
    g1, g2 = lora_world1[0]["grads"], lora_world2[0]["grads"]
    assert g1.keys() == g2.keys() and g1
    assert max(g.abs().max().item() for g in g1.values()) > 1e-3
    for n in g1:
        torch.testing.assert_close(g2[n], g1[n], rtol=1e-4, atol=1e-7, msg=n)
    assert lora_world2[1]["grads"].keys() == g1.keys()


@pytest.mark.e2e
def test_an_update_changes_only_the_adapters(lora_world1):
    (res,) = lora_world1
    before, after = res["before"], res["after"]
    assert before.keys() == after.keys()
    lora_keys = [k for k in before if ".lora_" in k]
    assert len(lora_keys) == 28
    for k in before:
        if k in lora_keys:
            assert (after[k] - before[k]).abs().max() > 1e-4, k
        else:
            assert torch.equal(after[k], before[k]), k
    # the weights that leave the worker: HF names, W + (alpha / r) B A written out by hand
    merged = res["merged"]
    q = "model.layers.1.self_attn.q_proj"
    want = after[f"{q}.base_layer.weight"] + (ALPHA / RANK) * (
        after[f"{q}.lora_B.default.weight"] @ after[f"{q}.lora_A.default.weight"])
    torch.testing.assert_close(merged[f"{q}.weight"], want, rtol=0, atol=1e-6)
    assert not any(".lora_" in k or "base_layer" in k for k in merged)
    assert torch.equal(merged["model.embed_tokens.weight"], after["model.embed_tokens.weight"])


def _wrap(model_path: str, **kw):
    from peer_rl.workers.lora import Adapters

    return Adapters(LoRASettings(**kw), model_path).wrap(
        AutoModelForCausalLM.from_pretrained(model_path))


@pytest.mark.parametrize("targets", [["nope_proj"], ["c_attn", "c_proj"]])
def test_targets_that_name_no_layer_are_refused_naming_the_key(tiny_model, targets):
    """A typo, and GPT-2's layer names on a Qwen2 model (a rank with no such layers)."""
    with pytest.raises(ValueError, match=r"^model\.lora\.target_modules=\[.*no layer of .* to "
                                         r"adapt with model\.lora\.rank=8"):
        _wrap(tiny_model, rank=8, target_modules=targets)


def test_a_tied_output_layer_is_refused_naming_the_key(tiny_model):
    with pytest.raises(ValueError, match=r"^model\.lora\.target_modules: lm_head shares"):
        _wrap(tiny_model, rank=8, target_modules=["q_proj", "lm_head"])


def test_an_adapter_of_another_rank_is_refused(tiny_model, adapter_dir):
    with pytest.raises(ValueError, match=rf"holds an adapter of rank {RANK}, but "
                                         r"model\.lora\.rank=8: set model\.lora\.rank=4"):
        _wrap(tiny_model, rank=8, lora_adapter_path=adapter_dir)


def test_the_vision_tower_and_its_aligner_get_no_adapter():
    """The shipped tiny vision-language policy: every linear layer of the language model is
    adapted, none inside the vision tower (merger included), and only adapters train."""
    from peft.tuners.lora import LoraLayer

    from peer_rl.trainer.tiny_cache import SHIPPED_DIR
    from peer_rl.workers.fsdp import auto_class, vision_tower
    from peer_rl.workers.lora import Adapters

    path = str(SHIPPED_DIR / "policy")
    model = auto_class(path).from_pretrained(path)
    tower = vision_tower(model)
    tower_linears = [m for m in tower.modules() if isinstance(m, torch.nn.Linear)]
    assert tower_linears and any("merger" in n for n, _ in tower.named_modules())
    Adapters(LoRASettings(rank=4), path).wrap(model)
    adapted = [n for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    assert adapted and not any(isinstance(m, LoraLayer) for m in tower.modules())
    assert all(not p.requires_grad for p in tower.parameters())
    assert all(("lora_" in n) == p.requires_grad for n, p in model.named_parameters())


@pytest.mark.e2e
def test_a_lora_checkpoint_holds_the_adapters_and_resumes_at_another_world_size(lora_world1,
                                                                                 lora_world2):
    from pathlib import Path

    from safetensors import safe_open

    w2, (w1,) = lora_world2[0], lora_world1
    names = set()
    for f in (Path(w2["ckpt"]) / "dcp").glob("*.safetensors"):
        with safe_open(str(f), "pt") as fh:
            names |= set(fh.keys())
    model = sorted(n for n in names if n.startswith("model/"))
    assert len(model) == 28 and all(".lora_" in n for n in model)      # no base weight
    assert {n for n in names if n.startswith("optim/")} == {
        f"optim/{n[len('model/'):]}/{k}" for n in model for k in ("exp_avg", "exp_avg_sq", "step")}
    # the round trip at two ranks: same weights, and the same next update as before the load
    assert max_diff(w2["loaded"], w2["saved"]) == 0.0
    moved = max_diff(w2["perturbed"], w2["saved"])
    assert moved > 1e-4 and max_diff(w2["replayed"], w2["perturbed"]) < 1e-6
    # two ranks -> one: the checkpoint's weights, then the update the two-rank run took next
    assert w1["extra"]["world_size"] == 2 and w1["extra"]["lora_rank"] == RANK
    assert max_diff(w1["loaded"], w2["saved"]) == 0.0
    assert max_diff(w1["resumed"], w2["perturbed"]) < 1e-5


@pytest.mark.e2e
def test_the_export_is_merged_and_its_adapter_loads_in_peft(tiny_model, lora_world2):
    """model/ is a plain HF directory with the adapters merged; model/adapter/ is PEFT's own
    format: PeftModel on the base model gives the same logits as the merged export."""
    from pathlib import Path

    from peft import PeftModel

    w2 = lora_world2[0]
    exported = Path(w2["ckpt"]) / "model"
    merged = AutoModelForCausalLM.from_pretrained(exported).eval()
    state = merged.state_dict()
    assert max_diff({k: state[k] for k in w2["saved"]}, w2["saved"]) == 0.0
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model),
                                     str(exported / "adapter")).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    ids = torch.tensor(make_batch().input_ids)
    with torch.no_grad():
        want, got, plain = merged(input_ids=ids).logits, peft(input_ids=ids).logits, \
            base(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert (want - plain).abs().max() > 1e-2                # the adapters changed the model


def test_a_checkpoint_of_another_rank_is_refused_naming_the_key(tmp_path):
    import json

    from peer_rl.workers.lora import FullWeights, policy_weights

    (tmp_path / "dcp").mkdir()
    (tmp_path / "dcp" / "state.json").write_text(json.dumps({"extra": {"lora_rank": 8}}))
    with pytest.raises(ValueError, match=r"holds LoRA adapters of rank 8, but model\.lora\.rank=0: "
                                         r"resume with model\.lora\.rank=8"):
        FullWeights().check_checkpoint(tmp_path / "dcp")
    (tmp_path / "dcp" / "state.json").write_text(json.dumps({"extra": {}}))
    with pytest.raises(ValueError, match=r"holds full weights, but model\.lora\.rank=4"):
        policy_weights(LoRASettings(rank=4), "unused").check_checkpoint(tmp_path / "dcp")


# ---------------------------------------------------------------- full-weight invariances, on adapters
@pytest.mark.e2e
def test_every_loss_and_aggregation_gives_the_one_batch_adapter_gradient(tiny_model, adapter_dir,
                                                                        tmp_path):
    """test_policy's invariance on adapters: the one-batch adapter gradient (world 1, one
    forward) equals the one accumulated over four 2-row micro-batches and the one averaged over
    two ranks (one padding a zero-weight row), under every (loss, aggregation); and the modes
    still differ from one another."""
    lora = dict(rank=RANK, lora_alpha=ALPHA, lora_adapter_path=adapter_dir)
    grads = assert_every_mode_gives_the_one_batch_gradient(tiny_model, tmp_path, lora=lora)
    for case, g in grads.items():
        assert len(g) == 28 and all(".lora_" in n for n in g), case      # adapters only


@pytest.mark.e2e
def test_packed_adapter_rows_train_as_the_padded_ones(tiny_model, adapter_dir, tmp_path):
    """actor.use_remove_padding on adapters, at one rank and two: the same policy and reference
    (adapters off) log-probs, losses, gradient norms and merged weights as right-padded
    micro-batches, and no padded position computed; the policy is not its reference."""
    lora = dict(rank=RANK, lora_alpha=ALPHA, lora_adapter_path=adapter_dir)
    for world in (1, 2):
        padded = run_group(world, tiny_model, "train", tmp_path / f"padded{world}", lora=lora)
        packed = run_group(world, tiny_model, "train", tmp_path / f"packed{world}", lora=lora,
                           use_remove_padding=True, ppo_max_token_len_per_gpu=40)
        assert_same_training(packed[0], padded[0])
        assert [r["padded"]["actor/padding_share"] for r in packed] == [0.0] * world
        merged_start = padded[0]["lp"]
        assert np.abs(merged_start.old_log_probs - merged_start.ref_log_prob).max() > 1e-2


@pytest.mark.e2e
def test_a_bfloat16_lora_update_whose_first_forward_is_the_reference_trains(tiny_model,
                                                                           adapter_dir,
                                                                           tmp_path):
    """One optimizer step on the whole batch skips the policy's no-grad pass, so a LoRA
    policy's first forward is the reference's, adapters off; PEFT marks them frozen while it
    lasts. Under bfloat16 compute at two ranks the adapters must still get their float32
    gradients (the regression: FSDP2 fixed its groups as untrained at that forward and the
    first backward failed) and take the step the float32 run takes, to bfloat16's round-off."""
    lora = dict(rank=RANK, lora_alpha=ALPHA, lora_adapter_path=adapter_dir)
    one_step = dict(ppo_mini_batch_size=8, ppo_epochs=1, lora=lora)   # the ckpt scenario's 8 rows
    runs = {dtype: run_group(2, tiny_model, "ckpt", tmp_path / dtype, dtype=dtype, **one_step)[0]
            for dtype in ("float32", "bfloat16")}
    f32, b16 = runs["float32"], runs["bfloat16"]
    assert b16["recomputation"]["dtype"] == "bfloat16"
    base = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    for r in (f32, b16):
        assert all(v.dtype == torch.float32 for v in r["saved"].values())
        assert max_diff({k: r["saved"][k] for k in base}, base) > 1e-3    # the adapters moved
    assert b16["first"]["actor/grad_norm"] == pytest.approx(f32["first"]["actor/grad_norm"],
                                                           rel=0.05)
    assert b16["first"]["actor/grad_norm"] != f32["first"]["actor/grad_norm"]
