"""The vision-language policy end to end on real engines: the images vLLM saw at rollout reach
the update (same log-probs), a frozen vision tower stays put while the language model trains,
and the weight sync carries only what training changed."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from peer_rl.data.bundled import sample_root
from peer_rl.protocol import Prompt, SamplingConfig, UpdateBatch
from peer_rl.prompts.reasoning import policy_messages
from peer_rl.config.worker_settings import PolicySettings, RolloutSettings
from sync_util import free_port, max_gap, push_policy

pytestmark = pytest.mark.e2e

FACES = sample_root() / "grpo" / "images"
HISTORY = [{"role": "seeker", "content": "I keep telling everyone I'm fine, but I'm not."}]


@pytest.fixture(scope="module")
def engines(tiny_models):
    from peer_rl.workers.policy import PolicyWorker
    from peer_rl.workers.rollout import RolloutWorker

    # the policy's process group first: on CPU the engine runs in this process and joins the
    # default group that exists rather than creating a second one
    policy = PolicyWorker(0, 1, "127.0.0.1", free_port(), tiny_models["policy"], PolicySettings(
        lr=5e-2, ppo_mini_batch_size=8, ppo_micro_batch_size=4, kl_loss_coef=0.0,
        freeze_vision_tower=True, dtype="float32"), backend="gloo")
    # float32 on both sides: the engine's log-probs are compared with the policy's
    rollout = RolloutWorker(tiny_models["policy"], RolloutSettings(kv_cache_gib=1, dtype="float32"))
    torch.set_num_threads(1)
    yield rollout, policy
    rollout.close()
    policy.shutdown()


def _batch(rollout, face: str = "sad"):
    frames = [str(FACES / f"face_{face}_1.png"), str(FACES / f"face_{face}_2.png")]
    prompts = [Prompt(0, policy_messages(HISTORY, "en", visual=True), frames),
               Prompt(1, policy_messages(HISTORY, "en"), [])]
    samples = rollout.generate(prompts, SamplingConfig(n=2, temperature=1.0, max_tokens=12))
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    images = [prompts[s.uid].images for s in samples]
    T = max(map(len, seqs))
    ids, attn, resp = (np.zeros((len(seqs), T), np.int64) for _ in range(3))
    for i, (s, seq) in enumerate(zip(samples, seqs)):
        ids[i, :len(seq)], attn[i, :len(seq)] = seq, 1
        resp[i, len(s.prompt_ids):len(seq)] = 1
    batch = UpdateBatch(ids, attn, resp, np.array([1.0, -1.0, 0.5, -0.5], np.float32),
                        images=images)
    return samples, seqs, batch


def test_visual_log_probs_equal_vllm_and_depend_on_the_image(engines, tiny_models):
    rollout, policy = engines
    samples, seqs, batch = _batch(rollout)
    image_token = policy.vision.image_token_id
    assert sum(t == image_token for t in samples[0].prompt_ids) == 8   # 2 frames x 4 tokens
    assert image_token not in samples[2].prompt_ids                     # the text row
    ours = policy.compute_log_prob(batch).old_log_probs
    theirs = rollout.prompt_logprobs(seqs, batch.images)
    assert max_gap(ours, theirs, seqs) < 1e-4
    # extra right padding (a batch padded to a longer step's width) is cut off per micro-batch,
    # images and all: the same log-probs
    wide = replace(batch, **{k: np.pad(getattr(batch, k), ((0, 0), (0, 7)))
                             for k in ("input_ids", "attention_mask", "response_mask")})
    np.testing.assert_allclose(policy.compute_log_prob(wide).old_log_probs[:, :ours.shape[1]],
                               ours, atol=1e-6)
    # the sampler's own log-probs (temperature 1) are the policy's renormalised without the
    # image placeholders it never samples, so never below the policy's (test_rollout.py checks
    # them exactly against transformers)
    for i, s in enumerate(samples):
        start = len(s.prompt_ids)
        gap = np.array(s.response_logprobs) - ours[i, start:start + len(s.response_ids)]
        assert gap.min() > -1e-4, gap
    # the faces matter: the same ids with another person's frames score differently
    swapped = replace(batch, images=[[str(FACES / "face_happy_1.png"),
                                      str(FACES / "face_happy_2.png")] if imgs else []
                                     for imgs in batch.images])
    other = policy.compute_log_prob(swapped).old_log_probs
    assert float(np.abs(other[:2] - ours[:2]).max()) > 1e-3
    np.testing.assert_allclose(other[2:], ours[2:], atol=1e-6)          # text rows unchanged


def test_ids_and_images_that_disagree_are_refused(engines):
    rollout, policy = engines
    _, _, batch = _batch(rollout)
    bad = replace(batch, images=[imgs[:1] for imgs in batch.images])    # one frame for two
    with pytest.raises(ValueError, match="8 image token\\(s\\) in the ids but its 1 image\\(s\\) "
                                         "expand to 4"):
        policy.compute_log_prob(bad)


def test_frozen_tower_stays_the_language_model_trains_and_only_it_is_synced(engines):
    rollout, policy = engines
    from peer_rl.workers import fsdp

    before = {k: v.clone() for k, v in fsdp.full_state_dict(policy.model).items()}
    tower = [k for k in before if ".visual." in f".{k}" and ".merger." not in k]
    assert tower and set(tower) == policy.frozen
    optim_keys = {k for k, p in policy.model.named_parameters() if p in policy.optim.state
                  or any(p is q for g in policy.optim.param_groups for q in g["params"])}
    assert not optim_keys & policy.frozen
    samples, seqs, batch = _batch(rollout)
    for _ in range(2):
        policy.update(batch)
    after = fsdp.full_state_dict(policy.model)
    assert all(torch.equal(before[k], after[k]) for k in tower)
    changed = [k for k in before if k not in policy.frozen and not torch.equal(before[k], after[k])]
    assert any("layers.0" in k for k in changed) and any("merger" in k for k in changed)
    assert all(not p.requires_grad and p.grad is None for n, p in policy.model.named_parameters()
               if n in policy.frozen)

    metas = policy.weight_metas(rollout.engine_dtype())
    sent = {m[0] for m in metas}
    assert not sent & set(fsdp.to_checkpoint_names(policy.model, {k: after[k] for k in policy.frozen}))
    assert any("merger" in k for k in sent)
    stats, received = push_policy(policy, rollout, bucket_bytes=1 << 16)
    assert received == len(metas)
    assert stats["bytes"] < sum(v.numel() * 4 for v in after.values())
    ours = policy.compute_log_prob(batch).old_log_probs
    assert max_gap(ours, rollout.prompt_logprobs(seqs, batch.images), seqs) < 1e-4
