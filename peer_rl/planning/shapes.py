"""A model's shape for planning: its config.json and parameter count, read without loading a
weight (the safetensors headers give exact counts), or a named public shape written out here for
a model not downloaded yet."""
from __future__ import annotations

import json
import math
from pathlib import Path

from peer_rl.compute.kv_cache import text_config

_QWEN25_TEXT_7B = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "tie_word_embeddings": False}
# public config.json values of the models PEER and ESCRAG-R1 train (their model cards)
NAMED = {
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
    attention (Q, K, V with biases, O), gated MLP and two norms, the final norm, and an output
    layer unless tied to the embeddings."""
    t = text_config(config)
    h, i, layers = t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"]
    heads = t["num_attention_heads"]
    kv, hd = t.get("num_key_value_heads") or heads, t.get("head_dim") or h // heads
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h + heads * hd + 2 * kv * hd
    per_layer = attn + 3 * h * i + 2 * h
    tied = t.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    embed = t["vocab_size"] * h
    return embed * (1 if tied else 2) + layers * per_layer + h


def vision_params(config: dict) -> int:
    """A Qwen2-VL-style vision tower: blocks of attention (fused QKV, projection) and a gated
    MLP, then the patch merger to the text width; 0 for a text-only model."""
    v = config.get("vision_config")
    if not v:
        return 0
    h, i, depth = v.get("hidden_size", v.get("embed_dim", 0)), v.get("intermediate_size", 0), \
        v.get("depth", 0)
    merged = h * v.get("spatial_merge_size", 2) ** 2
    return depth * (4 * h * h + 3 * h * i + 2 * h) + merged * merged + merged * \
        v.get("out_hidden_size", h)


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
