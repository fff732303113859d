"""workers.vllm_engine's pure helpers (no engine started)."""
from __future__ import annotations

import pytest

from workers.vllm_engine import lora_engine_args


@pytest.mark.parametrize("rank, slots", [(1, 1), (2, 8), (8, 8), (9, 16), (64, 64), (65, 128),
                                         (512, 512)])
def test_the_engines_adapter_slots_fit_the_next_rank_vllm_offers(rank, slots):
    assert lora_engine_args(rank) == {"enable_lora": True, "max_lora_rank": slots, "max_loras": 1}


def test_a_rank_beyond_vllms_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"model.lora.rank=513: .* up to 512.*model.lora.merge"):
        lora_engine_args(513)
