import pytest

from peer_rl.config import ConfigError, load_config


def test_default_is_tiny_peer_rur():
    cfg = load_config([])
    assert cfg.recipe == "tiny" and cfg.algorithm.rur.enable and cfg.rollout.n == 4
    assert cfg.trainer.output_dir == "outputs/tiny"


def test_recipes_by_name_with_overrides():
    cfg = load_config(["recipe=peer_rur", "rollout.num_workers=2", "trainer.total_steps=5"])
    assert (cfg.experiment_name, cfg.rollout.num_workers, cfg.trainer.total_steps) == ("peer_rur", 2, 5)
    assert cfg.algorithm.rur.enable and cfg.actor.lr == 1e-6 and cfg.data.train_batch_size == 24
    assert not load_config(["recipe=peer"]).algorithm.rur.enable


@pytest.mark.parametrize("override,message", [
    ("rollout.nn=2", "config key 'rollout.nn'"),
    ("actor.lr=fast", "config key 'actor.lr'"),
    ("rollout.num_workers=-1", "rollout.num_workers=-1: expected a positive value"),
    ("actor.world_size=0", "actor.world_size=0: expected a positive value"),
    ("rollout.n=1", "rollout.n=1: GRPO needs at least 2"),
    ("algorithm.rur.history_agg=median", "algorithm.rur.history_agg='median'"),
    ("recipe=nope", "recipe='nope': no such recipe"),
    ("resume=/does/not/exist", "resume='/does/not/exist'"),
    ("actor.ppo_micro_batch_size=3", "must be a multiple of actor.ppo_micro_batch_size=3"),
    ("bogus", "expected key=value"),
])
def test_bad_config_fails_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=None) as err:
        load_config([override])
    assert message in str(err.value)


def test_config_is_read_only():
    cfg = load_config([])
    with pytest.raises(Exception):
        cfg.rollout.n = 8
