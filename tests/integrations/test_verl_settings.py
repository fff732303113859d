"""The verl plug-in's settings (peer_rl.integrations.verl_settings) read from a verl config in
the main environment: no verl needed, so these run in the default fast tier."""
import pytest
from omegaconf import OmegaConf

from peer_rl.config.schema import load_config
from peer_rl.config.worker_settings import RewardWeights
from peer_rl.integrations.verl_settings import PeerRewardSettings


def verl_config(**reward_kwargs):
    return OmegaConf.create({"reward": {"reward_kwargs": {"judge_path": "/j", **reward_kwargs}}})


def test_the_weights_default_to_peer_rls_own():
    got = PeerRewardSettings.from_verl(verl_config()).weights
    assert got == RewardWeights(step=0.5, preference=0.5, format=1.0)
    assert OmegaConf.to_object(load_config([]).reward_model.weights) == got


def test_reward_kwargs_weights_are_read_key_by_key():
    s = PeerRewardSettings.from_verl(verl_config(weights={"step": 1, "format": 0.25}))
    assert s.weights == RewardWeights(step=1.0, preference=0.5, format=0.25)


@pytest.mark.parametrize("weights,message", [
    ({"preference": -1}, "reward.reward_kwargs.weights.preference=-1.0: expected a value >= 0"),
    ({"fromat": 1}, "fromat"),
    ({"step": "high"}, "weights.step"),
])
def test_a_bad_weight_fails_at_start_up_naming_the_key(weights, message):
    with pytest.raises(ValueError) as err:
        PeerRewardSettings.from_verl(verl_config(weights=weights))
    assert message in str(err.value)
