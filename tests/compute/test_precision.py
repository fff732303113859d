"""Each pool's dtype setting resolved (peer_rl.compute.precision): worked out by hand from the rule
`auto` = bfloat16 on a GPU or a CPU with native bfloat16, float32 elsewhere."""
from __future__ import annotations

import pytest

from peer_rl.compute.precision import BYTES, check_dtype, dtype_line, resolve_dtype


@pytest.mark.parametrize("setting, on_gpu, cpu_bf16, want", [
    ("auto", True, False, "bfloat16"),
    ("auto", False, True, "bfloat16"),
    ("auto", False, False, "float32"),
    ("AUTO", False, False, "float32"),
    ("float32", True, True, "float32"),      # as set, whatever the hardware
    ("bfloat16", False, False, "bfloat16"),
])
def test_auto_follows_the_hardware_and_a_set_dtype_is_kept(setting, on_gpu, cpu_bf16, want):
    assert resolve_dtype(setting, on_gpu, cpu_bf16) == want


@pytest.mark.parametrize("bad", ["fp16", "bf16", "float16", "", None, True])
def test_a_dtype_outside_the_choices_names_its_key(bad):
    with pytest.raises(ValueError, match=r"actor\.dtype=.*expected one of auto, float32, bfloat16"):
        check_dtype(bad, "actor.dtype")


def test_the_start_up_line_says_how_the_dtype_was_chosen():
    assert dtype_line("bfloat16", "bfloat16", False) == "bfloat16 (as set)"
    assert dtype_line("auto", "bfloat16", True) == "bfloat16 (auto: GPU)"
    assert dtype_line("auto", "bfloat16", False) == "bfloat16 (auto: the CPU has AVX512-BF16/AMX)"
    assert dtype_line("auto", "float32", False) == "float32 (auto: the CPU lacks AVX512-BF16/AMX)"


def test_bytes_per_value():
    assert BYTES == {"float32": 4, "bfloat16": 2}
