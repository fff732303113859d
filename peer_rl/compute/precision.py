"""Each pool's compute dtype: `auto`, `float32` or `bfloat16`, resolved where the pool runs.

Why `auto` is not float32 on CPUs: a CPU with AVX512-BF16 or AMX multiplies bfloat16 matrices
2-3x faster than float32 ones, and the policy's forward and backward, the engines' prefill and
decode are matmuls at heart. A CPU without them emulates bfloat16 and gains nothing, so `auto`
is float32 there. The policy keeps float32 master weights, optimizer state and gradient
reduction under bfloat16 (FSDP2's MixedPrecisionPolicy), and log-probs are taken in float32 from
the bfloat16 logits (peer_rl.compute.token_logprobs). Like peer_rl.config.worker_settings, this module imports
nothing of the project.
"""
from __future__ import annotations

from typing import Literal, get_args

# the config's dtype fields are typed DType, so OmegaConf refuses another value at the merge
DType = Literal["auto", "float32", "bfloat16"]
DTYPES = get_args(DType)
BYTES = {"float32": 4, "bfloat16": 2}


def cpu_has_bf16() -> bool:
    """Whether this machine's CPU computes bfloat16 natively (AVX512-BF16 or AMX tiles), the
    test vLLM's CPU platform makes for its bfloat16 kernels."""
    import torch  # deferred: torch (~2 s); the CLI starts without it

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, p, lambda: False)()) for p in probes)


def check_dtype(setting, key: str) -> str:
    """The setting, lower-cased, or a ValueError naming `key` and the choices."""
    value = str(setting).lower()
    if value not in DTYPES:
        raise ValueError(f"{key}={setting!r}: expected one of {', '.join(DTYPES)}")
    return value


def resolve_dtype(setting, on_gpu: bool, cpu_bf16: bool, key: str = "dtype") -> str:
    """`float32` or `bfloat16` for a pool whose setting is `setting`: `auto` is bfloat16 on a
    GPU and on a CPU with native bfloat16 (`cpu_bf16`, from cpu_has_bf16 on the pool's node),
    float32 elsewhere."""
    value = check_dtype(setting, key)
    if value != "auto":
        return value
    return "bfloat16" if on_gpu or cpu_bf16 else "float32"


def dtype_line(setting, resolved: str, on_gpu: bool) -> str:
    """How a pool's dtype was chosen, for its start-up line."""
    if check_dtype(setting, "dtype") != "auto":
        return f"{resolved} (as set)"
    if on_gpu:
        return f"{resolved} (auto: GPU)"
    why = "has" if resolved == "bfloat16" else "lacks"
    return f"{resolved} (auto: the CPU {why} AVX512-BF16/AMX)"
