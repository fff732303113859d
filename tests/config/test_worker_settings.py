"""Worker settings: one dataclass per worker kind, the config sections extend them, and a worker
takes its settings whole (no constructor keyword repeats a setting with a default of its own)."""
import inspect
from dataclasses import fields

import pytest

from peer_rl.config.schema import load_config
from peer_rl.config.worker_settings import (
    JudgeSettings,
    PolicySettings,
    RedundancySettings,
    RolloutSettings,
    narrow,
)

WORKER_SETTINGS = {"peer_rl.workers.policy:PolicyWorker": PolicySettings,
                   "peer_rl.workers.rollout:RolloutWorker": RolloutSettings,
                   "peer_rl.workers.unifireward:UnifiRewardWorker": JudgeSettings,
                   "peer_rl.workers.unifireward:PairRewardWorker": JudgeSettings,
                   "peer_rl.workers.scalar_reward:ScalarRewardWorker": JudgeSettings,
                   "peer_rl.workers.redundancy:RedundancyWorker": RedundancySettings}


def _cls(entry: str):
    import importlib

    module, name = entry.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("entry", sorted(WORKER_SETTINGS))
def test_a_worker_takes_its_settings_whole(entry):
    params = inspect.signature(_cls(entry)).parameters
    settings = WORKER_SETTINGS[entry]
    assert params["settings"].annotation in (f"{settings.__name__} | None", settings)
    repeated = {f.name for f in fields(settings)} & set(params)
    assert not repeated, f"{entry} repeats {sorted(repeated)} beside its {settings.__name__}"


def test_narrow_keeps_the_recipes_values_and_drops_the_sections_own_keys():
    cfg = load_config(["actor.lr=2e-6", "actor.world_size=2", "actor.policy_loss.loss_mode=gspo",
                       "rollout.kv_cache_gib=3", "rollout.n=8"])
    policy = narrow(PolicySettings, cfg.actor)
    assert type(policy) is PolicySettings and not hasattr(policy, "world_size")
    assert policy.lr == 2e-6 and policy.policy_loss.loss_mode == "gspo"
    assert policy.kl_loss_coef == PolicySettings.kl_loss_coef       # untouched: the default
    rollout = narrow(RolloutSettings, cfg.rollout)
    assert rollout == RolloutSettings(kv_cache_gib=3) and not hasattr(rollout, "n")


def test_a_section_without_the_settings_fields_is_refused_naming_them():
    cfg = load_config([])
    # retrieval has an embedding_model, but none of RUR's penalty keys
    with pytest.raises(TypeError, match="^RetrievalConfig lacks RedundancySettings's alpha, "
                                        "beta, cjk_chars_per_word, history_agg, group_agg, "
                                        "batch_size$"):
        narrow(RedundancySettings, cfg.retrieval)


def test_a_misspelt_worker_setting_still_fails_at_start_up_naming_the_key():
    from peer_rl.config.schema import ConfigError

    with pytest.raises(ConfigError, match="actor.lrr"):
        load_config(["actor.lrr=1e-6"])
    with pytest.raises(ConfigError, match="algorithm.rur.alpah"):
        load_config(["algorithm.rur.alpah=0.1"])
