"""KV cache sizing from a model's config.json: bytes per token checked against published
figures, and the step's sizing against a count by hand."""
from __future__ import annotations

import json

from peer_rl.compute.kv_cache import fit_kv_cache, kv_bytes_per_token, step_kv_bytes
from peer_rl.config.worker_settings import EngineSettings, RolloutSettings

LLAMA3_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "hidden_size": 4096}
QWEN25_05B = {"num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
              "hidden_size": 896}


def test_bytes_per_token_match_the_published_figures():
    # Llama-3-8B: 128 KiB of KV a token in 16-bit (32 layers x 8 KV heads x 128 dims x K, V)
    assert kv_bytes_per_token(LLAMA3_8B, 2) == 128 * 1024
    # Qwen2.5-0.5B: 12 KiB a token in 16-bit (24 layers x 2 KV heads x 64 dims x K, V)
    assert kv_bytes_per_token(QWEN25_05B, 2) == 12 * 1024


def test_a_vision_language_config_is_read_from_its_text_config_and_head_dim_wins():
    vl = {"vision_config": {"hidden_size": 1280}, "text_config": dict(QWEN25_05B)}
    assert kv_bytes_per_token(vl, 4) == 24 * 1024
    # Qwen3-style: head_dim set apart from hidden_size / heads (1024 / 16 = 64, head_dim 128)
    qwen3 = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
             "hidden_size": 1024, "head_dim": 128}
    assert kv_bytes_per_token(qwen3, 2) == 2 * 28 * 8 * 128 * 2
    # no num_key_value_heads: multi-head attention, one KV head per head
    mha = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    assert kv_bytes_per_token(mha, 4) == 2 * 2 * 4 * 16 * 4


def test_the_step_is_counted_in_whole_blocks():
    # 3 sequences of 300 tokens: 3 blocks of 128 each -> 9 blocks x 128 tokens x 10 bytes
    assert step_kv_bytes(3, 300, 10) == 9 * 128 * 10
    assert step_kv_bytes(3, 256, 10) == 6 * 128 * 10
    assert step_kv_bytes(1, 300, 10, block_size=16) == 19 * 16 * 10


def test_zero_is_sized_from_the_step_and_a_set_size_is_kept(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(QWEN25_05B, max_position_embeddings=1000)))
    fitted = fit_kv_cache(RolloutSettings(kv_cache_gib=0, max_model_len=2048), str(tmp_path), 8)
    # max_model_len capped at the model's 1,000 positions -> 8 blocks of 128 = 1,024 tokens
    assert fitted.max_num_seqs == 8
    assert fitted.kv_cache_gib * 2**30 == 8 * 1024 * 24 * 1024
    kept = EngineSettings(kv_cache_gib=0.5)
    assert fit_kv_cache(kept, str(tmp_path), 8) is kept


def test_rows_shorter_than_max_model_len_are_sized_as_they_are_but_never_below_one_full(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_05B))
    per_token = 24 * 1024                              # float32
    # 8 sequences of at most 600 tokens (5 blocks of 128) with max_model_len 2,048
    fitted = fit_kv_cache(RolloutSettings(kv_cache_gib=0, max_model_len=2048), str(tmp_path), 8,
                          seq_len=600)
    assert fitted.kv_cache_gib * 2**30 == 8 * 640 * per_token
    # one sequence of 600: vLLM still needs room for one 2,048-token sequence
    one = fit_kv_cache(RolloutSettings(kv_cache_gib=0, max_model_len=2048), str(tmp_path), 1,
                       seq_len=600)
    assert one.kv_cache_gib * 2**30 == 2048 * per_token
