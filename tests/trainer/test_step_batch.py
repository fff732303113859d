"""The policy update's input as the controller builds it from samples (pure, no Ray)."""
import numpy as np
import pytest

from peer_rl.trainer.step_batch import update_batch
from peer_rl.protocol import Sample, UpdateBatch


def test_rows_are_right_padded_and_only_responses_are_masked_in():
    a = Sample(uid=0, prompt_ids=[1, 2, 3], response_ids=[4], response_logprobs=[-0.1], text="")
    b = Sample(uid=0, prompt_ids=[1], response_ids=[6, 7], response_logprobs=[-0.2, -0.3],
               text="")
    batch = update_batch([a, b], np.array([0.5, -0.5]))
    assert batch.input_ids.tolist() == [[1, 2, 3, 4], [1, 6, 7, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch.response_mask.tolist() == [[0, 0, 0, 1], [0, 1, 1, 0]]
    assert batch.advantages.dtype == np.float32
    assert batch.behavior_log_probs is None and batch.policy_versions is None  # synchronous
    assert batch.temperature == 1.0 and batch.images is None
    assert batch.group_ids.tolist() == [0, 0]          # one group: the update keeps it together


def test_a_staleness_bound_ships_the_samplers_log_probs_and_versions():
    a = Sample(uid=0, prompt_ids=[1, 2], response_ids=[5, 6], response_logprobs=[-0.5, -1.5],
               text="", policy_version=3)
    b = Sample(uid=1, prompt_ids=[9], response_ids=[8], response_logprobs=[-2.0], text="",
               policy_version=4)
    batch = update_batch([a, b], np.array([1.0, -1.0]), max_staleness=1)
    np.testing.assert_array_equal(batch.behavior_log_probs,
                                  np.array([[0.0, 0.0, -0.5, -1.5], [0.0, -2.0, 0.0, 0.0]],
                                           dtype=np.float32))
    assert batch.policy_versions.tolist() == [3, 4] and batch.max_staleness == 1
    assert batch.group_ids.tolist() == [0, 1]


def test_the_temperature_and_the_frames_ride_with_the_rows():
    a = Sample(uid=0, prompt_ids=[1, 2], response_ids=[3], response_logprobs=[-0.1], text="",
               images=["/faces/a.png", "/faces/b.png"])
    b = Sample(uid=1, prompt_ids=[1], response_ids=[4], response_logprobs=[-0.2], text="")
    batch = update_batch([a, b], np.array([1.0, -1.0]), temperature=0.7)
    assert batch.temperature == 0.7
    assert batch.images == [["/faces/a.png", "/faces/b.png"], []]


def test_an_update_batch_whose_parts_disagree_is_refused_naming_the_part():
    ids = np.ones((2, 4), np.int64)
    with pytest.raises(ValueError, match=r"UpdateBatch.response_mask: shape \(2, 3\), expected "
                                         r"\(2, 4\)"):
        UpdateBatch(ids, ids, np.ones((2, 3), np.int64), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="UpdateBatch.advantages: 3 rows, expected 2"):
        UpdateBatch(ids, ids, ids, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="UpdateBatch.group_ids: 1 rows, expected 2"):
        UpdateBatch(ids, ids, ids, np.zeros(2, np.float32), group_ids=np.zeros(1, np.int64))
