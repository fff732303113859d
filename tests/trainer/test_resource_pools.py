"""The pool table: every pool (and every reward_model.kind) names a worker class that imports,
and what the factory constructs each worker with fits that class (no Ray started)."""
import inspect

from peer_rl.config.reward_kinds import registered_kinds
from peer_rl.config.schema import load_config
from peer_rl.trainer.resource_pools import PoolFactory
from peer_rl.trainer.tiny_cache import SHIPPED_DIR
from peer_rl.config.worker_settings import (
    JudgeSettings,
    PolicyLossConfig,
    PolicySettings,
    RedundancySettings,
    RewardWeights,
    RolloutSettings,
)


def test_every_pool_and_reward_kind_resolves_to_its_worker_class():
    got = {}
    for kind in registered_kinds():
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
                       "algorithm.rur.alpha=0.25", "reward_model.weights.preference=2",
                       # float32 engines: the KV arithmetic below at 4 bytes a value (the next
                       # test has bfloat16's)
                       "rollout.dtype=float32", "reward_model.dtype=float32"])
    factory = PoolFactory(cfg, str(SHIPPED_DIR / "policy"), str(SHIPPED_DIR / "judge"), "/m/index")
    second = _bound(factory, "rollout", 1)
    assert second["model_path"] == str(SHIPPED_DIR / "policy") and second["seed"] == 8
    assert type(second["settings"]) is RolloutSettings
    # kv_cache_gib 0 (the schema's default) sizes each engine's KV cache for its step: the tiny
    # models keep 2 layers x 2 KV heads x 64 dims x K and V x 4 bytes = 2,048 bytes a token.
    # Rollout: 4 prompts x n=6 = 24 sequences of 1,024 tokens (8 blocks of 128) = 48 MiB.
    assert second["settings"] == RolloutSettings(max_model_len=1024, kv_cache_gib=48 / 1024,
                                                 max_num_seqs=24, dtype="float32")
    # the judge: 24 samples of its 4,096-token max_model_len = 192 MiB
    judge = _bound(factory, "reward_model", 1)
    assert judge["settings"] == JudgeSettings(max_tokens=12, kv_cache_gib=192 / 1024,
                                              max_num_seqs=24, dtype="float32",
                                              weights=RewardWeights(preference=2.0))
    assert judge["seed"] == 7
    assert _bound(factory, "redundancy")["settings"] == RedundancySettings(alpha=0.25)
    assert _bound(factory, "retrieval") == {"index_dir": "/m/index",
                                            "embedding_model": cfg.retrieval.embedding_model}
    rank = _bound(factory, "actor", 1, rendezvous=("10.0.0.5", 29500))
    assert (rank["rank"], rank["world_size"], rank["master_addr"], rank["master_port"]) == \
        (1, 2, "10.0.0.5", 29500)
    assert rank["rollout_n"] == 6 and rank["seed"] == 7 and rank["max_row_len"] == 1024
    # the schema's defaults (recomputation auto), the recipe's (tiny.yaml: token budget 4096
    # under a 1.25 GiB activation cap) and the command line's, and Dr. GRPO's divisor resolved
    # to the reply length (null in the section)
    assert rank["settings"] == PolicySettings(
        lr=3e-6, policy_loss=PolicyLossConfig("gspo"), ppo_max_token_len_per_gpu=4096,
        micro_batch_activation_gib=1.25, gradient_checkpointing="auto", loss_scale_factor=96)


def test_engines_get_a_resolved_dtype_and_a_kv_cache_sized_in_it():
    """The tiny models' KV at 2 bytes a value (bfloat16) is half the float32 figure above:
    1,024 bytes a token, so 24 sequences of 1,024 tokens take 24 MiB; `auto` reaches an engine
    as the dtype it resolved to, never as `auto`."""
    from peer_rl.compute.precision import cpu_has_bf16

    cfg = load_config(["rollout.n=6", "rollout.max_model_len=1024", "rollout.dtype=bfloat16",
                       "reward_model.dtype=auto"])
    factory = PoolFactory(cfg, str(SHIPPED_DIR / "policy"), str(SHIPPED_DIR / "judge"))
    rollout = _bound(factory, "rollout")["settings"]
    assert (rollout.dtype, rollout.kv_cache_gib) == ("bfloat16", 24 / 1024)
    judge = _bound(factory, "reward_model")["settings"]
    assert judge.dtype == ("bfloat16" if cpu_has_bf16() else "float32")
    assert judge.kv_cache_gib == (96 if judge.dtype == "bfloat16" else 192) / 1024
    line = factory.dtype_line()
    assert line.startswith("engine dtype: rollout bfloat16 (as set); reward_model ")
    assert "(auto: the CPU " in line
    gpu = PoolFactory(load_config(["resources.rollout.gpus_per_worker=1"]), "p", "j")
    assert gpu.engine_dtype("rollout") == "bfloat16"           # auto on a GPU pool


def test_the_process_and_outcome_pair_gets_both_paths_and_the_larger_kv_cache(tmp_path):
    import json

    for name, layers in (("prm", 2), ("orm", 6)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(
            {"num_hidden_layers": layers, "num_attention_heads": 2, "hidden_size": 128,
             "max_position_embeddings": 4096}))
    prm, orm = str(tmp_path / "prm"), str(tmp_path / "orm")
    factory = PoolFactory(load_config(["reward_model.kind=prm_orm", f"reward_model.path={prm}",
                                       f"reward_model.outcome_path={orm}",
                                       "reward_model.max_model_len=1024",
                                       "reward_model.dtype=float32"]), "p", prm)
    got = _bound(factory, "reward_model")
    assert (got["model_path"], got["outcome_path"]) == (prm, orm)
    # both engines get the outcome model's size (6 layers x 2 heads x 64 dims x K, V x 4 bytes
    # = 6,144 bytes a token) for the tiny recipe's 4 x 4 = 16 samples of 1,024 tokens
    assert got["settings"].kv_cache_gib * 2**30 == 16 * 1024 * 6144


def test_a_policy_rank_computes_on_the_whole_cpus_its_bundle_reserves():
    from peer_rl.trainer.resource_pools import policy_env

    threads = {cpus: policy_env(load_config([f"resources.actor.cpus_per_worker={cpus}"])
                                .resources.actor)["OMP_NUM_THREADS"]
               for cpus in (0.25, 1, 2.5, 8)}
    assert threads == {0.25: "1", 1: "1", 2.5: "2", 8: "8"}


def test_actor_num_threads_overrides_the_bundles_cpus():
    from peer_rl.trainer.resource_pools import policy_env

    cfg = load_config(["resources.actor.cpus_per_worker=0.25", "actor.num_threads=2"])
    assert policy_env(cfg.resources.actor, cfg.actor.num_threads)["OMP_NUM_THREADS"] == "2"


def test_a_policy_rank_gets_glibcs_mmap_threshold_in_bytes_unless_it_is_0():
    from peer_rl.trainer.resource_pools import policy_env

    res = load_config([]).resources.actor
    assert policy_env(res, 0, 4)["MALLOC_MMAP_THRESHOLD_"] == str(4 * 1024 * 1024)
    assert policy_env(res, 0, 0.5)["MALLOC_MMAP_THRESHOLD_"] == "524288"
    assert "MALLOC_MMAP_THRESHOLD_" not in policy_env(res, 0, 0)


def test_gpu_engines_are_left_to_vllms_own_sizing():
    cfg = load_config(["resources.rollout.gpus_per_worker=1",
                       "resources.reward_model.gpus_per_worker=1"])
    factory = PoolFactory(cfg, str(SHIPPED_DIR / "policy"), str(SHIPPED_DIR / "judge"),
                          longest_prompt=500)
    for pool in ("rollout", "reward_model"):
        s = factory.engine_settings(pool)
        assert (s.kv_cache_gib, s.max_num_seqs) == (0.0, 0)
    assert factory.kv_cache_line() == ""


def test_a_pool_without_gpus_sees_none_and_a_gpu_pool_is_told_its_share():
    """Ray 2.60 leaves CUDA_VISIBLE_DEVICES as the node has it for an actor that asked for no
    GPU: the placement layer empties it for such pools, and names each pool's GPUs, so that the
    worker chooses its device from its own bundle (peer_rl.workers.devices)."""
    cfg = load_config(["resources.reward_model.gpus_per_worker=0.5",
                       "resources.actor.gpus_per_worker=1"])
    factory = PoolFactory(cfg, "p", "j")
    base = {"TOKENIZERS_PARALLELISM": "false"}
    assert factory.actor_env("redundancy", base) == {
        "TOKENIZERS_PARALLELISM": "false", "PEER_RL_POOL": "redundancy:0",
        "CUDA_VISIBLE_DEVICES": ""}
    assert factory.actor_env("retrieval", {})["CUDA_VISIBLE_DEVICES"] == ""
    assert factory.actor_env("reward_model", {}) == {"PEER_RL_POOL": "reward_model:0.5"}
    assert factory.actor_env("actor", {}) == {"PEER_RL_POOL": "actor:1"}
