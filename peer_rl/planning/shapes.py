"""A model's shape for planning: its config.json and parameter count, read without loading a
weight (the safetensors headers give exact counts), or a named public shape written out here for
a model not downloaded yet."""
from __future__ import annotations

import json
import math
from pathlib import Path

from peer_rl.compute.kv_cache import text_config

# public config.json values of the models PEER and ESCRAG-R1 train (their model cards)
# Qwen2.5-7B(-Instruct), ESCRAG-R1's policy and reward model: transformers' Qwen2Config
# defaults are Qwen2-7B's (hidden 4096, 32 layers, vocab 151936); they agree with Qwen2.5-7B only
# on tie_word_embeddings false and max_position_embeddings 32768. The other values of
# _QWEN25_TEXT_7B are the Qwen2.5-7B-Instruct card's (28 layers, hidden 3584, intermediate 18944,
# 28 heads, 4 KV heads, vocab 152064), and the test counts what transformers' Qwen2ForCausalLM
# builds from them.
_QWEN25_TEXT_7B = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "tie_word_embeddings": False}
# Qwen3-VL-8B-Instruct, the policy (and judge base) of PEER (arXiv 2508.09521): the values of its
# public config.json (Qwen/Qwen3-VL-8B-Instruct). Held here against transformers 5.19's own model
# (tests/planning/test_plan.py builds Qwen3VLForConditionalGeneration from these on the meta
# device and counts 8,767,123,696 parameters, 576,388,336 of them the vision tower). Where each
# number comes from:
# - transformers' Qwen3VLTextConfig defaults agree on vocab_size 151936, hidden_size 4096,
#   num_attention_heads 32, head_dim 128, attention_bias false; Qwen3VLConfig's
#   tie_word_embeddings false. Its defaults are not the 8B's depth: num_hidden_layers 36 (default
#   32), intermediate_size 12288 (default 22016), num_key_value_heads 8 (default 32) and
#   max_position_embeddings 262144 (default 128000) are the 8B card's (this machine
#   has no hub access to re-read the card; the parameter count does not depend on the
#   last).
# - transformers' Qwen3VLVisionConfig defaults are the 8B's vision tower: depth 27, hidden_size
#   1152, intermediate_size 4304, 16 heads, patch 16, 2304 position embeddings, deepstack
#   mergers after blocks 8, 16, 24; out_hidden_size 4096 (default 3584) is the 8B card's (the
#   text width it feeds).
_QWEN3_VL_8B = {
    "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 4096,
                    "intermediate_size": 12288, "num_hidden_layers": 36,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                    "vocab_size": 151936, "attention_bias": False, "tie_word_embeddings": False,
                    "max_position_embeddings": 262144},
    "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                      "num_heads": 16, "patch_size": 16, "temporal_patch_size": 2,
                      "in_channels": 3, "num_position_embeddings": 2304,
                      "out_hidden_size": 4096, "spatial_merge_size": 2,
                      "deepstack_visual_indexes": [8, 16, 24]},
    "tie_word_embeddings": False}
NAMED = {
    "Qwen3-VL-8B": _QWEN3_VL_8B,
    "Qwen2.5-VL-7B": {"text_config": {**_QWEN25_TEXT_7B, "max_position_embeddings": 128000},
                      "vision_config": {"depth": 32, "hidden_size": 1280,
                                        "intermediate_size": 3420, "out_hidden_size": 3584,
                                        "spatial_merge_size": 2}},
    "Qwen2.5-7B": {**_QWEN25_TEXT_7B, "max_position_embeddings": 32768},
    "Qwen2.5-VL-3B": {"text_config": {"hidden_size": 2048, "intermediate_size": 11008,
                                      "num_hidden_layers": 36, "num_attention_heads": 16,
                                      "num_key_value_heads": 2, "vocab_size": 151936,
                                      "tie_word_embeddings": True,
                                      "max_position_embeddings": 128000},
                      "vision_config": {"depth": 32, "hidden_size": 1280,
                                        "intermediate_size": 3420, "out_hidden_size": 2048,
                                        "spatial_merge_size": 2}},
    "SmolLM2-135M": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
                     "tie_word_embeddings": True, "max_position_embeddings": 8192},
}


def text_params(config: dict) -> int:
    """The language model's parameters from its config: embeddings, every decoder layer's
    attention (Q, K, V with biases unless attention_bias is false, O; Qwen3's per-head Q and K
    norms), gated MLP and two norms, the final norm, and an output layer unless tied to the
    embeddings."""
    t = text_config(config)
    h, i, layers = t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"]
    heads = t["num_attention_heads"]
    kv, hd = t.get("num_key_value_heads") or heads, t.get("head_dim") or h // heads
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    attn += (heads * hd + 2 * kv * hd) if t.get("attention_bias", True) else 0
    attn += 2 * hd if str(t.get("model_type", "")).startswith("qwen3") else 0
    per_layer = attn + 3 * h * i + 2 * h
    tied = t.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    embed = t["vocab_size"] * h
    return embed * (1 if tied else 2) + layers * per_layer + h


def vision_params(config: dict) -> int:
    """A Qwen2-VL-style vision tower: blocks of attention (fused QKV, projection) and a gated
    MLP, then the patch merger to the text width; Qwen3-VL's (deepstack_visual_indexes) counted
    as _qwen3_vision_params; 0 for a text-only model."""
    v = config.get("vision_config")
    if not v:
        return 0
    if "deepstack_visual_indexes" in v:
        return _qwen3_vision_params(v)
    h, i, depth = v.get("hidden_size", v.get("embed_dim", 0)), v.get("intermediate_size", 0), \
        v.get("depth", 0)
    merged = h * v.get("spatial_merge_size", 2) ** 2
    return depth * (4 * h * h + 3 * h * i + 2 * h) + merged * merged + merged * \
        v.get("out_hidden_size", h)


def _qwen3_vision_params(v: dict) -> int:
    """Qwen3-VL's vision tower, as transformers' Qwen3VLVisionModel builds it: the patch
    embedding (a biased 3-D convolution) and learned position embeddings; blocks of two biased
    LayerNorms, fused QKV and projection with biases and a plain (ungated) biased MLP; the patch
    merger (LayerNorm over the hidden width, then merged -> merged -> text width) and one more
    merger per deepstack layer, whose LayerNorm is over the merged width."""
    h, i, depth = v["hidden_size"], v["intermediate_size"], v["depth"]
    out = v.get("out_hidden_size", h)
    merged = h * v.get("spatial_merge_size", 2) ** 2
    patch = v.get("in_channels", 3) * v.get("temporal_patch_size", 2) * v.get("patch_size", 16) ** 2
    embed = patch * h + h + v.get("num_position_embeddings", 0) * h
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
    mlp = merged * merged + merged + merged * out + out
    deepstack = len(v["deepstack_visual_indexes"]) * (2 * merged + mlp)
    return embed + depth * block + 2 * h + mlp + deepstack


def weight_params(model_dir: Path) -> int | None:
    """Exact parameter count from the safetensors headers (no tensor read); None without any."""
    from safetensors import safe_open  # deferred: safetensors (pulls in torch)

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    n = 0
    for f in files:
        with safe_open(str(f), "pt") as fh:
            n += sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys())
    return n


def model_shape(spec: str) -> tuple[dict, int, int, str]:
    """(config, total params, vision-tower params, where it came from) of a model directory or
    a NAMED shape."""
    if spec in NAMED:
        config = NAMED[spec]
        vision = vision_params(config)
        return config, text_params(config) + vision, vision, f"{spec} (named shape)"
    d = Path(spec)
    path = d / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{spec}: no config.json there and not a named shape "
                                f"(named: {', '.join(NAMED)})")
    config = json.loads(path.read_text(encoding="utf-8"))
    vision = vision_params(config)
    exact = weight_params(d)
    total = exact if exact is not None else text_params(config) + vision
    return config, total, vision, f"{spec} ({'weights headers' if exact else 'config.json'})"
