"""The placement layer: turns the plain worker classes into Ray actors on placement groups.

One placement group per pool, sized from the recipe (`<pool>.num_workers`,
`resources.<pool>.{cpus,gpus}_per_worker`), so each pool scales independently. This is the only
place (with the CLI) where peer_rl reaches into workers/.
"""
from __future__ import annotations

import os
import socket

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from peer_rl.methods import method_class
from peer_rl.trainer.faults import with_faults
from peer_rl.trainer.worker_group import Pools

# pool -> worker class ("module:Class"; the reward model's by reward_model.kind)
WORKERS = {"rollout": "workers.rollout:RolloutWorker",
           "reward_model": {"unifireward": "workers.unifireward:UnifiRewardWorker",
                            "prm_orm": "workers.unifireward:PairRewardWorker",
                            "scalar": "workers.scalar_reward:ScalarRewardWorker"},
           "redundancy": "workers.redundancy:RedundancyWorker",
           "retrieval": "workers.retrieval:RetrievalWorker",
           "actor": "workers.policy:PolicyWorker"}
_PLAIN_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def engine_env() -> dict:
    """Environment for an actor that runs vLLM: no hub access, quiet engine logs.

    The CPU KV-cache size is set by workers.vllm_engine.make_llm from the worker's argument.
    """
    return {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR")}


def _bundle(res) -> dict:
    b = {"CPU": float(res.cpus_per_worker)}
    if res.gpus_per_worker:
        b["GPU"] = float(res.gpus_per_worker)
    return b


def _pool_pg(name: str, res, n: int, timeout_s: float, strategy: str = "PACK"):
    pg = placement_group([_bundle(res)] * n, strategy=strategy, name=f"peer-rl-{name}")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise RuntimeError(
            f"resources.{name}: could not place {n} x {_bundle(res)} within {timeout_s:.0f} s "
            f"(ray.placement_timeout_s); "
            f"cluster resources: {ray.cluster_resources()}. Lower {name}.num_workers or "
            f"resources.{name}.*_per_worker, or add nodes.")
    return pg


def _opts(pg, i: int, res, env: dict, max_restarts: int = 0) -> dict:
    return {"num_cpus": res.cpus_per_worker, "num_gpus": res.gpus_per_worker,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
            "runtime_env": {"env_vars": env}, "max_restarts": max_restarts, "max_task_retries": 0}


@ray.remote(num_cpus=0)
def _node_address() -> tuple[str, int]:
    """Address and a free port on the node of policy rank 0 (torch.distributed rendezvous)."""
    ip = ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind(("", 0))
        return ip, s.getsockname()[1]


class PoolFactory:
    """Creates (and re-creates, after a crash) the actors of every pool."""

    def __init__(self, cfg, policy_path: str, judge_path: str, index_dir: str = ""):
        self.cfg, self.policy_path, self.judge_path = cfg, policy_path, judge_path
        self.index_dir = index_dir
        self.pgs: dict = {}

    def worker_class(self, pool: str) -> type:
        """The worker class of a pool (WORKERS), imported only when its pool starts."""
        import importlib

        entry = WORKERS[pool]
        if isinstance(entry, dict):
            entry = entry[self.cfg.reward_model.kind]
        module, name = entry.split(":")
        return getattr(importlib.import_module(module), name)

    def _actor(self, pool: str, i: int, env: dict):
        """Pool `pool`'s worker class as a Ray actor class on bundle i of its placement group
        (armed by PEER_RL_FAULTS where that names it)."""
        return ray.remote(with_faults(self.worker_class(pool))).options(
            **_opts(self.pgs[pool], i, self.cfg.resources[pool], env,
                    self.cfg.trainer.max_actor_restarts))

    def rollout(self, i: int):
        c = self.cfg.rollout
        return self._actor("rollout", i, engine_env()).remote(
            self.policy_path, seed=self.cfg.trainer.seed + i, kv_cache_gib=c.kv_cache_gib,
            max_model_len=c.max_model_len, gpu_memory_utilization=c.gpu_memory_utilization,
            enforce_eager=c.enforce_eager, tensor_parallel_size=c.tensor_model_parallel_size)

    def reward_model(self, i: int):
        c = self.cfg.reward_model
        cls = self._actor("reward_model", i, engine_env())
        if c.kind == "scalar":
            return cls.remote(self.judge_path, seed=self.cfg.trainer.seed,
                              kv_cache_gib=c.kv_cache_gib, max_model_len=c.max_model_len,
                              gpu_memory_utilization=c.gpu_memory_utilization)
        pair = c.kind == "prm_orm"      # two engines in one actor: they score every item
        engine = dict(seed=self.cfg.trainer.seed, kv_cache_gib=c.kv_cache_gib,
                      max_tokens=c.max_tokens, max_model_len=c.max_model_len,
                      gpu_memory_utilization=c.gpu_memory_utilization / (2 if pair else 1),
                      enforce_eager=c.enforce_eager)
        if pair:
            return cls.remote(self.judge_path, c.outcome_path, **engine)
        return cls.remote(self.judge_path, **engine)

    def redundancy(self, i: int = 0):
        r = self.cfg.algorithm.rur
        return self._actor("redundancy", i, _PLAIN_ENV).remote(
            r.embedding_model, batch_size=r.batch_size, alpha=r.alpha, beta=r.beta,
            history_agg=r.history_agg, group_agg=r.group_agg,
            cjk_chars_per_word=r.cjk_chars_per_word)

    def retrieval(self, i: int = 0):
        return self._actor("retrieval", i, _PLAIN_ENV).remote(
            self.index_dir, self.cfg.retrieval.embedding_model)

    def actor_group(self) -> list:
        a, res = self.cfg.actor, self.cfg.resources.actor
        pg = self.pgs["actor"]
        addr, port = ray.get(_node_address.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=0)).remote())
        env = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
        # policy ranks are never restarted by Ray (max_restarts 0): a dead rank ends the step
        return [ray.remote(with_faults(self.worker_class("actor"))).options(
            **_opts(pg, r, res, env)).remote(
            rank=r, world_size=a.world_size, master_addr=addr, master_port=port,
            model_path=self.policy_path, lr=a.lr, weight_decay=a.weight_decay,
            grad_clip=a.grad_clip, kl_loss_coef=a.kl_loss_coef, kl_loss_type=a.kl_loss_type,
            clip_ratio=a.clip_ratio, entropy_coeff=a.entropy_coeff,
            # the worker counts sequences; the recipe counts prompts (verl's meaning)
            ppo_mini_batch_size=a.ppo_mini_batch_size * self.cfg.rollout.n,
            ppo_micro_batch_size=a.ppo_micro_batch_size,
            ppo_epochs=a.ppo_epochs, seed=self.cfg.trainer.seed,
            freeze_vision_tower=a.freeze_vision_tower,
            gradient_checkpointing=a.gradient_checkpointing, logits_chunk_size=a.logits_chunk_size,
            ppo_max_token_len_per_gpu=a.ppo_max_token_len_per_gpu,
            ref_param_offload=a.ref_param_offload, behavior_weight_cap=a.behavior_weight_cap,
            loss_mode=a.policy_loss.loss_mode, loss_agg_mode=a.loss_agg_mode,
            clip_ratio_low=a.clip_ratio_low, clip_ratio_high=a.clip_ratio_high,
            clip_ratio_c=a.clip_ratio_c,
            # a constant, so that every micro-batch divides alike (verl's default, the mask's
            # width, changes with each micro-batch's longest row here)
            loss_scale_factor=a.loss_scale_factor or self.cfg.rollout.response_length)
            for r in range(a.world_size)]

    def make_pools(self) -> Pools:
        cfg = self.cfg
        # the method's pools (peer_rl.methods: what its scoring calls), the policy's, and the
        # encoder the in-training evaluation measures diversity with
        needs = method_class(cfg).pools(cfg) | {"actor"}
        if cfg.trainer.eval_freq > 0:
            needs.add("redundancy")
        count = {"rollout": cfg.rollout.num_workers, "reward_model": cfg.reward_model.num_workers,
                 "actor": cfg.actor.world_size, "redundancy": 1,
                 "retrieval": cfg.retrieval.num_workers}
        sizes = {name: n for name, n in count.items() if name in needs}
        embeds = "redundancy" in sizes
        for name, n in sizes.items():
            self.pgs[name] = _pool_pg(name, cfg.resources[name], n, cfg.ray.placement_timeout_s,
                                      "SPREAD" if name == "rollout" else "PACK")
        pools = Pools(rollout=[self.rollout(i) for i in range(sizes["rollout"])],
                      reward_model=[self.reward_model(i) for i in range(sizes["reward_model"])],
                      actor=self.actor_group(),
                      redundancy=[self.redundancy()] if embeds else [],
                      retrieval=[self.retrieval(i) for i in range(sizes.get("retrieval", 0))],
                      restart=self.restart,
                      classes={name: self.worker_class(name) for name in sizes})
        # surface constructor failures (bad model path, engine OOM) now, naming the pool
        for name, handles in (("rollout", pools.rollout), ("reward_model", pools.reward_model),
                              ("actor", pools.actor), ("redundancy", pools.redundancy),
                              ("retrieval", pools.retrieval)):
            try:
                ray.get([h.health.remote() for h in handles])
            except ray.exceptions.RayActorError as exc:
                raise RuntimeError(f"pool {name!r} failed to start: {exc}") from None
        return pools

    def restart(self, pool: str, i: int):
        return getattr(self, pool)(i)

    def shutdown(self, pools: Pools | None = None) -> None:
        """Stop engines cleanly (their core processes), then free the placement groups."""
        if pools is not None:
            closing = [h.close.remote() for h in pools.rollout + pools.reward_model]
            closing += [h.shutdown.remote() for h in pools.actor]
            ray.wait(closing, num_returns=len(closing), timeout=30)
            # then end the processes: a worker left to exit on its own can outlive the cluster
            for h in (pools.rollout + pools.reward_model + pools.actor + pools.redundancy
                      + pools.retrieval):
                ray.kill(h, no_restart=True)
        for pg in self.pgs.values():
            remove_placement_group(pg)
        self.pgs.clear()
