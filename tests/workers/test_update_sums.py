"""The policy update's named reductions (peer_rl.workers.update_sums): two ranks' sums, packed,
summed as the all_reduce sums them and read back by name, give the hand-computed metrics."""
import pytest

from peer_rl.workers.update_sums import UpdateSums

# every field a different value, so a field read back under another's name shows in the metrics
RANK0 = UpdateSums(pg_loss=0.5, kl_loss=0.02, entropy=1.5, pg_clipfrac=3.0, pg_clipfrac_lower=1.0,
                   ppo_kl=0.05, tokens=10.0, positions=16.0, real_positions=12.0,
                   forward_tokens=70.0, old_ref_log_prob_s=1.0, update_actor_s=4.0, update_total_s=5.0,
                   image_preprocess_s=0.0)
RANK1 = UpdateSums(pg_loss=0.3, kl_loss=0.04, entropy=1.3, pg_clipfrac=1.0, pg_clipfrac_lower=0.0,
                   ppo_kl=0.15, tokens=30.0, positions=48.0, real_positions=28.0,
                   forward_tokens=110.0, old_ref_log_prob_s=3.0, update_actor_s=6.0, update_total_s=9.0,
                   image_preprocess_s=0.5)
# two optimizer steps on two ranks: losses / 2 steps, token-weighted figures / 40 tokens,
# timings / 2 ranks, padding 1 - 40 / 64, forward tokens summed over ranks
EXPECTED = {"actor/pg_loss": 0.4, "actor/kl_loss": 0.03, "actor/entropy": 1.4,
            "actor/pg_clipfrac": 0.1, "actor/pg_clipfrac_lower": 0.025, "actor/ppo_kl": 0.005,
            "actor/tokens": 40.0, "actor/padding_share": 0.375, "actor/forward_tokens": 180.0,
            "timing_s/old_ref_log_prob": 2.0, "timing_s/update_actor": 5.0,
            "timing_s/update_total": 7.0, "timing_s/image_preprocess": 0.25}


def test_two_ranks_sums_reduce_to_the_hand_computed_metrics():
    reduced = UpdateSums.unpack(RANK0.pack() + RANK1.pack())    # what all_reduce(SUM) does
    metrics = reduced.metrics(steps=2, world_size=2)
    assert metrics.keys() == EXPECTED.keys()
    for key, value in EXPECTED.items():
        assert metrics[key] == pytest.approx(value, abs=1e-12), key


def test_adding_sums_adds_field_by_field_and_a_packed_sum_unpacks_to_itself():
    total = RANK0 + RANK1
    assert (total.tokens, total.ppo_kl, total.image_preprocess_s) == (40.0, 0.2, 0.5)
    assert UpdateSums.unpack(RANK1.pack()) == RANK1


def test_no_steps_and_no_tokens_divide_by_one_not_by_zero():
    metrics = UpdateSums().metrics(steps=0, world_size=1)
    assert metrics["actor/pg_loss"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0
    assert metrics["actor/padding_share"] == 1.0
