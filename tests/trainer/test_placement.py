"""The pool table: every pool (and every reward_model.kind) names a worker class that imports."""
from peer_rl.config import load_config
from peer_rl.trainer.placement import WORKERS, PoolFactory


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
