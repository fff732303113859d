"""Prompts that leave no room for the reply are refused before any pool starts, naming the
row; the lengths themselves are checked against vLLM's in tests/workers/test_rollout.py."""
from __future__ import annotations

import pytest

from peer_rl.config.schema import ConfigError, load_config
from peer_rl.trainer.resource_pools import PoolFactory
from peer_rl.trainer.prompt_lengths import check_prompt_room, prompt_lengths
from peer_rl.trainer.tiny_cache import SHIPPED_DIR


def test_a_prompt_without_room_for_its_reply_is_named():
    rows = [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    check_prompt_room(rows, [100, 800, 300], 1024, 224)          # 800 = 1024 - 224 fits
    with pytest.raises(ConfigError) as err:
        check_prompt_room(rows, [900, 801, 300], 1024, 224)
    msg = str(err.value)
    assert "2 training prompt(s)" in msg and "row id 'a'" in msg and "900 tokens" in msg
    assert "rollout.max_model_len - rollout.response_length = 1024 - 224 = 800" in msg


def test_text_rows_are_counted_through_the_policys_chat_template():
    from transformers import AutoTokenizer

    policy = str(SHIPPED_DIR / "policy")
    messages = [{"role": "user", "content": "I failed my exam again."}]
    rendered = AutoTokenizer.from_pretrained(policy).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)
    assert rendered.startswith("<|im_start|>user\n")
    ids = AutoTokenizer.from_pretrained(policy)(rendered, add_special_tokens=False)["input_ids"]
    assert prompt_lengths([{"messages": messages}], policy) == [len(ids)]


def test_the_rollout_cache_is_sized_for_the_longest_prompt_plus_the_reply():
    # a float32 engine: 4 bytes a KV value (test_placement has bfloat16's 2)
    cfg = load_config(["rollout.n=6", "rollout.response_length=96", "rollout.max_model_len=1024",
                       "rollout.dtype=float32"])
    factory = PoolFactory(cfg, str(SHIPPED_DIR / "policy"), str(SHIPPED_DIR / "judge"),
                          longest_prompt=500)
    s = factory.engine_settings("rollout")
    # 4 prompts x 6 = 24 sequences of 596 tokens (5 blocks of 128) x 2,048 bytes a token
    assert (s.max_num_seqs, s.kv_cache_gib * 2**30) == (24, 24 * 640 * 2048)
    assert "rollout 30.0 MiB (24 sequence(s) of the step x 596 tokens)" in factory.kv_cache_line()

