"""Random Qwen2-shaped policies for benchmarks and the memory checks of larger-than-tiny runs.

Built once (with the tiny tokenizer) under the peer-rl cache, renamed into place. The shapes:
  10M   hidden 256, 8 layers, vocab of the tiny tokenizer
  100M  hidden 768, 12 layers, intermediate 2560 (the "~100M" policy), tiny vocabulary
  500M  Qwen2.5-0.5B's shape, its 151,936-token output layer included (what makes logits big)
  135M  SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads / 3 key-value heads, vocab 49,152)
        with random weights: its timings without fetching the real model
`peer-rl bench model NAME` prints the directory, for `model.path=`.
"""
from __future__ import annotations

from pathlib import Path

from peer_rl.files.out_paths import staged_dir
from peer_rl.models.pinned import fetch
from peer_rl.planning.shapes import weight_params
from peer_rl.supervised.tiny_models import (build_tiny_causal_lm, default_cache_dir,
                                            ensure_tiny_models)

# --model names beyond the random shapes: a pinned real model and the data settings a benchmark
# then takes its prompts with
REAL_MODELS = {"smollm2": ("smollm2-135m-instruct", ["data.languages=[english]"])}

SHAPES = {
    "10M": dict(hidden_size=256, num_layers=8, num_heads=4, intermediate_size=1024),
    "100M": dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=2560),
    "500M": dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                 intermediate_size=4864, vocab_size=151_936),
    "135M": dict(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
                 intermediate_size=1536, vocab_size=49_152),
}


def real_model(name: str) -> tuple[str, list[str]]:
    """A REAL_MODELS entry: (its directory, fetched once; the data overrides its prompts take)."""
    pinned, data = REAL_MODELS[name]
    return fetch(pinned), data


def random_policy(name: str) -> str:
    """The directory of the random policy `name` (one of SHAPES), building it on first use."""
    if name not in SHAPES:
        raise ValueError(f"model shape {name!r}: expected one of {', '.join(SHAPES)}")
    final = default_cache_dir() / "bench" / name
    if (final / "model.safetensors").exists():
        return str(final)
    tokenizer = ensure_tiny_models(default_cache_dir())["policy"]
    # another process that finished first keeps its copy
    with staged_dir(final, "keep", complete=lambda d: (d / "model.safetensors").exists()) as tmp:
        build_tiny_causal_lm(tmp, tokenizer, seed=0, **SHAPES[name])
    return str(final)


def num_params(path: str) -> int:
    """Parameters of a built policy, from its safetensors headers (peer_rl.planning.shapes)."""
    n = weight_params(Path(path))
    if n is None:
        raise FileNotFoundError(f"{path}: no *.safetensors there")
    return n


def main(rest: list[str]) -> int:
    """`peer-rl bench model [NAME ...]`: build (once) and print each random policy's directory."""
    for name in rest or list(SHAPES):
        print(f"{name}\t{random_policy(name)}")
    return 0
