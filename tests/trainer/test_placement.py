"""The pool table: every pool (and every reward_model.kind) names a worker class that imports,
and what the factory constructs each worker with fits that class (no Ray started)."""
import inspect

from peer_rl.config import load_config
from peer_rl.trainer.placement import WORKERS, PoolFactory
from peer_rl.worker_settings import (
    JudgeSettings,
    PolicyLossConfig,
    PolicySettings,
    RedundancySettings,
    RolloutSettings,
)


def test_every_pool_and_reward_kind_resolves_to_its_worker_class():
    got = {}
    for kind in WORKERS["reward_model"]:
        factory = PoolFactory(load_config([f"reward_model.kind={kind}", "reward_model.path=a",
                                           "reward_model.outcome_path=b"]), "p", "j")
        got[kind] = factory.worker_class("reward_model").__name__
        for pool in ("rollout", "redundancy", "retrieval", "actor"):
            got[pool] = factory.worker_class(pool).__name__
    assert got == {"unifireward": "UnifiRewardWorker", "prm_orm": "PairRewardWorker",
                   "scalar": "ScalarRewardWorker", "rollout": "RolloutWorker",
                   "redundancy": "RedundancyWorker", "retrieval": "RetrievalWorker",
                   "actor": "PolicyWorker"}


def _bound(factory, pool, i=0, **kw):
    """worker_args bound to the worker class's own signature: the factory and the class agree."""
    args, kwargs = factory.worker_args(pool, i, **kw)
    return inspect.signature(factory.worker_class(pool)).bind(*args, **kwargs).arguments


def test_each_worker_gets_its_section_narrowed_to_its_settings_and_its_own_seed():
    cfg = load_config(["trainer.seed=7", "rollout.n=6", "rollout.response_length=96",
                       "rollout.max_model_len=1024", "actor.lr=3e-6", "actor.world_size=2",
                       "actor.policy_loss.loss_mode=gspo", "reward_model.max_tokens=12",
                       "algorithm.rur.alpha=0.25"])
    factory = PoolFactory(cfg, "/m/policy", "/m/judge", "/m/index")
    second = _bound(factory, "rollout", 1)
    assert second["model_path"] == "/m/policy" and second["seed"] == 8
    assert type(second["settings"]) is RolloutSettings
    # the default recipe (recipes/tiny.yaml) sizes the engines' KV caches at 0.5 GiB
    assert second["settings"] == RolloutSettings(max_model_len=1024, kv_cache_gib=0.5)
    judge = _bound(factory, "reward_model", 1)
    assert judge["settings"] == JudgeSettings(max_tokens=12, kv_cache_gib=0.5)
    assert judge["seed"] == 7
    assert _bound(factory, "redundancy")["settings"] == RedundancySettings(alpha=0.25)
    assert _bound(factory, "retrieval") == {"index_dir": "/m/index",
                                            "embedding_model": cfg.retrieval.embedding_model}
    rank = _bound(factory, "actor", 1, rendezvous=("10.0.0.5", 29500))
    assert (rank["rank"], rank["world_size"], rank["master_addr"], rank["master_port"]) == \
        (1, 2, "10.0.0.5", 29500)
    assert rank["rollout_n"] == 6 and rank["seed"] == 7
    # the schema's defaults, the recipe's (tiny.yaml: token budget 4096, recomputation) and
    # the command line's, and Dr. GRPO's divisor resolved to the reply length (null in the
    # section)
    assert rank["settings"] == PolicySettings(
        lr=3e-6, policy_loss=PolicyLossConfig("gspo"), ppo_max_token_len_per_gpu=4096,
        gradient_checkpointing=True, loss_scale_factor=96)


def test_the_process_and_outcome_pair_gets_both_paths():
    factory = PoolFactory(load_config(["reward_model.kind=prm_orm", "reward_model.path=/m/prm",
                                       "reward_model.outcome_path=/m/orm"]), "p", "/m/prm")
    got = _bound(factory, "reward_model")
    assert (got["model_path"], got["outcome_path"]) == ("/m/prm", "/m/orm")


def test_a_policy_rank_computes_on_the_whole_cpus_its_bundle_reserves():
    from peer_rl.trainer.placement import policy_env

    threads = {cpus: policy_env(load_config([f"resources.actor.cpus_per_worker={cpus}"])
                                .resources.actor)["OMP_NUM_THREADS"]
               for cpus in (0.25, 1, 2.5, 8)}
    assert threads == {0.25: "1", 1: "1", 2.5: "2", 8: "8"}
