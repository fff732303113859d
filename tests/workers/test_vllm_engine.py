"""peer_rl.workers.vllm_engine's pure helpers (no engine started)."""
from __future__ import annotations

import pytest

from peer_rl.workers.vllm_engine import lora_engine_args


@pytest.mark.parametrize("rank, slots", [(1, 1), (2, 8), (8, 8), (9, 16), (64, 64), (65, 128),
                                         (512, 512)])
def test_the_engines_adapter_slots_fit_the_next_rank_vllm_offers(rank, slots):
    assert lora_engine_args(rank) == {"enable_lora": True, "max_lora_rank": slots, "max_loras": 1}


def test_a_rank_beyond_vllms_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"model.lora.rank=513: .* up to 512.*model.lora.merge"):
        lora_engine_args(513)


def test_a_tensor_parallel_engine_runs_vllms_own_processes_inside_its_actor():
    """Issue 56.1: inside a Ray actor vLLM would otherwise choose its Ray executor for a world
    size above 1 and refuse the actor's bundle of tp GPUs; one worker stays in the actor's
    process. make_llm passes these on CPU and GPU alike."""
    from peer_rl.workers.vllm_engine import executor_args

    assert executor_args(1) == {"distributed_executor_backend": "uni"}
    assert executor_args(2) == {"distributed_executor_backend": "mp"}
    assert executor_args(8) == {"distributed_executor_backend": "mp"}
    with pytest.raises(ValueError, match="tensor_parallel_size=0"):
        executor_args(0)
