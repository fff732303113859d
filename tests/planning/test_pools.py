"""Which workers start together (start_waves): worked out by hand from the recipes' pools."""
from peer_rl.config.schema import load_config
from peer_rl.planning.pools import pool_sizes, start_waves


def test_cpu_pools_start_all_at_once():
    cfg = load_config([])                                  # tiny: no GPUs anywhere
    sizes = pool_sizes(cfg)
    waves = start_waves(sizes, cfg.resources)
    assert len(waves) == 1
    assert sorted(waves[0]) == sorted((p, i) for p, n in sizes.items() for i in range(n))


def test_judges_sharing_a_gpu_start_one_after_another():
    """peer_rur_8gpu: 3 rollout engines on whole GPUs, 2 judges on half a GPU each, 4 policy
    ranks, the encoder. The rollout engines start together; each judge starts alone once
    everything before it is up; then the policy ranks and the encoder together."""
    cfg = load_config(["recipe=peer_rur_8gpu"])
    assert cfg.resources.reward_model.gpus_per_worker == 0.5
    waves = start_waves(pool_sizes(cfg), cfg.resources)
    assert waves == [[("rollout", 0), ("rollout", 1), ("rollout", 2)],
                     [("reward_model", 0)],
                     [("reward_model", 1)],
                     [("actor", 0), ("actor", 1), ("actor", 2), ("actor", 3),
                      ("redundancy", 0)]]


def test_whole_gpu_engines_and_policy_ranks_on_part_of_a_gpu_are_not_held_back():
    """Only engines (vLLM profiles its device at start-up) on part of a GPU start alone: whole-GPU
    judges start with the rest, and policy ranks always start together (one rendezvous)."""
    cfg = load_config(["recipe=peer_rur", "resources.reward_model.gpus_per_worker=1",
                       "resources.actor.gpus_per_worker=0.5", "actor.world_size=2",
                       "rollout.num_workers=1", "reward_model.num_workers=1"])
    assert start_waves(pool_sizes(cfg), cfg.resources) == [
        [("rollout", 0), ("reward_model", 0), ("actor", 0), ("actor", 1), ("redundancy", 0)]]
