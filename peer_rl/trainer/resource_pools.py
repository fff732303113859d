"""The placement layer: turns the plain worker classes into Ray actors on placement groups.

One placement group per pool, sized from the recipe (`<pool>.num_workers`,
`resources.<pool>.{cpus,gpus}_per_worker`), so each pool scales independently. This is the only
place (with the CLI) where peer_rl reaches into workers/.
"""
from __future__ import annotations

import functools
import importlib
import math
import os
import socket
import time
from collections import Counter
from dataclasses import replace

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from peer_rl.compute.kv_cache import fit_kv_cache, kv_bytes_per_token, read_config
from peer_rl.planning.pools import ENGINE_POOLS, ORDER, bundle, pool_sizes, start_waves, strategy
from peer_rl.config.reward_kinds import reward_kind
from peer_rl.compute.precision import BYTES, cpu_has_bf16, dtype_line, resolve_dtype
from peer_rl.trainer.faults import with_faults
from peer_rl.trainer.worker_group import Pools
from peer_rl.config.worker_settings import (
    JudgeSettings,
    LoRASettings,
    PolicySettings,
    RedundancySettings,
    RolloutSettings,
    SeekerSettings,
    lora_merged,
    narrow,
)
from peer_rl.workers.devices import pool_env

# pool -> worker class ("module:Class"); the reward model's is its kind's
# (peer_rl.config.reward_kinds: RewardKind.worker)
WORKERS = {"rollout": "peer_rl.workers.rollout:RolloutWorker",
           "redundancy": "peer_rl.workers.redundancy:RedundancyWorker",
           "retrieval": "peer_rl.workers.retrieval:RetrievalWorker",
           "seeker": "peer_rl.workers.seeker:SeekerWorker",
           "actor": "peer_rl.workers.policy:PolicyWorker"}
_PLAIN_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def engine_env() -> dict:
    """Environment for an actor that runs vLLM: no hub access, quiet engine logs.

    The CPU KV-cache size is set by peer_rl.workers.vllm_engine.make_llm from the worker's argument.
    """
    return {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR")}


def malloc_env(mmap_threshold_mib: float) -> dict:
    """glibc's fixed mmap threshold (actor.malloc_mmap_threshold_mib; 0: none, glibc's own)."""
    if mmap_threshold_mib <= 0:
        return {}
    return {"MALLOC_MMAP_THRESHOLD_": str(int(mmap_threshold_mib * 2**20))}


def policy_env(res, num_threads: int = 0, mmap_threshold_mib: float = 0.0) -> dict:
    """A policy rank's environment: `num_threads` compute threads (actor.num_threads), or by
    default as many as its bundle reserves whole CPUs (at least one), so a rank never takes
    cores its neighbours were promised; glibc's fixed mmap threshold where set
    (actor.malloc_mmap_threshold_mib)."""
    return {"TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": str(num_threads or max(1, int(res.cpus_per_worker))),
            **malloc_env(mmap_threshold_mib)}


def _pool_pg(name: str, res, n: int, timeout_s: float, strategy: str = "PACK"):
    pg = placement_group([bundle(res)] * n, strategy=strategy, name=f"peer-rl-{name}")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise RuntimeError(
            f"resources.{name}: could not place {n} x {bundle(res)} within {timeout_s:.0f} s "
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

    def __init__(self, cfg, policy_path: str, judge_path: str, index_dir: str = "",
                 longest_prompt: int = 0):
        """`longest_prompt`: the data's longest rollout prompt in tokens (0: unknown, as for
        ESCRAG-R1's second pass, whose prompts carry the retrieved exemplars); a rollout
        sequence is then at most that plus rollout.response_length."""
        self.cfg, self.policy_path, self.judge_path = cfg, policy_path, judge_path
        self.longest_prompt = longest_prompt
        self.index_dir = index_dir
        self.pgs: dict = {}
        self.ready_s: dict[str, float] = {}      # pool -> seconds until its workers were up
        self.kind = reward_kind(cfg.reward_model.kind)

    def reward_paths(self) -> tuple[str, ...]:
        """The models each reward engine loads, in its worker's argument order: the judge
        (reward_model.path, or the tiny one resolved for it), then the kind's others."""
        rm = self.cfg.reward_model
        return (self.judge_path, *(rm[key] for key in self.kind.models[1:]))

    def worker_class(self, pool: str) -> type:
        """The worker class of a pool (WORKERS, the reward model's kind), imported only when its
        pool starts."""
        entry = self.kind.worker if pool == "reward_model" else WORKERS[pool]
        module, name = entry.split(":")
        return getattr(importlib.import_module(module), name)

    def _actor(self, pool: str, i: int, env: dict, max_restarts: int | None = None):
        """Pool `pool`'s worker class as a Ray actor class on bundle i of its placement group
        (armed by PEER_RL_FAULTS where that names it); restarted by Ray up to
        trainer.max_actor_restarts times unless `max_restarts` says otherwise."""
        restarts = self.cfg.trainer.max_actor_restarts if max_restarts is None else max_restarts
        return ray.remote(with_faults(self.worker_class(pool))).options(
            **_opts(self.pgs[pool], i, self.cfg.resources[pool], self.actor_env(pool, env),
                    restarts))

    def actor_env(self, pool: str, env: dict) -> dict:
        """`env` plus what tells a worker of `pool` which devices are its own
        (peer_rl.workers.devices.pool_env: a pool without GPUs sees none)."""
        return {**env, **pool_env(pool, self.cfg.resources[pool].gpus_per_worker)}

    def worker_args(self, pool: str, i: int = 0,
                    rendezvous: tuple[str, int] = ("", 0)) -> tuple[tuple, dict]:
        """What worker i of `pool` is constructed with: its settings narrowed from its config
        section (peer_rl.config.worker_settings), model paths and seed; a policy rank also the group's
        rendezvous. Pure, so a test can bind it to the class's signature without Ray."""
        return getattr(self, f"_{pool}_args")(i, rendezvous)

    def step_sequences(self, pool: str) -> int:
        """The most sequences one engine of `pool` is given at once in a step: its share of the
        batch's prompts x rollout.n (the controller shards prompts to rollout engines and
        samples to reward engines, the first shards a row longer)."""
        c, n = self.cfg, self.cfg.rollout.n
        if pool == "rollout":
            return math.ceil(c.data.train_batch_size / c.rollout.num_workers) * n
        return math.ceil(c.data.train_batch_size * n / c[pool].num_workers)

    def _rollout_row(self) -> int:
        """The longest rollout sequence: the longest prompt plus the reply (0: unknown)."""
        return self.longest_prompt and self.longest_prompt + self.cfg.rollout.response_length

    def engine_settings(self, pool: str):
        """The settings each engine of `pool` starts with; on CPU kv_cache_gib 0 sized from the
        step (peer_rl.compute.kv_cache.fit_kv_cache; the models' own config.json say the bytes per
        token); GPU engines as configured (gpu_memory_utilization sizes their cache)."""
        dtype = self.engine_dtype(pool)
        kind = {"rollout": RolloutSettings, "seeker": SeekerSettings}.get(pool, JudgeSettings)
        settings = replace(narrow(kind, self.cfg[pool]), dtype=dtype)
        if self.cfg.resources[pool].gpus_per_worker:      # vLLM sizes it from the device
            return settings
        if pool == "rollout":
            return fit_kv_cache(settings, self.policy_path, self.step_sequences(pool),
                                self._rollout_row(), dtype_bytes=BYTES[dtype])
        if pool == "seeker":        # each live dialogue's chat, up to seeker.max_model_len
            return fit_kv_cache(settings, self.seeker_path(), self.step_sequences(pool),
                                dtype_bytes=BYTES[dtype])
        path, *more = self.reward_paths()
        if more:                                   # one size for all: the largest model's

            path = max((path, *more), key=lambda m: kv_bytes_per_token(read_config(m)))
        return fit_kv_cache(settings, path, self.step_sequences(pool), dtype_bytes=BYTES[dtype])

    def engine_dtype(self, pool: str) -> str:
        """rollout.dtype or reward_model.dtype resolved for where the engines run
        (peer_rl.compute.precision), so that their KV cache is sized in it: auto is bfloat16 on a GPU
        pool; a CPU pool follows the CPU of the node that runs this controller (a cluster's CPU
        nodes are taken to be alike)."""
        gpu = bool(self.cfg.resources[pool].gpus_per_worker)
        return resolve_dtype(self.cfg[pool].dtype, gpu, not gpu and self._cpu_bf16,
                             f"{pool}.dtype")

    @functools.cached_property
    def _cpu_bf16(self) -> bool:
        return cpu_has_bf16()

    def engine_pools(self) -> list[str]:
        """The pools of this run whose workers run vLLM."""
        return [pool for pool in pool_sizes(self.cfg) if pool in ENGINE_POOLS]

    def seeker_path(self) -> str:
        """The simulated seeker's model: seeker.path, else the policy's start model."""
        return self.cfg.seeker.path or self.policy_path

    def dtype_line(self) -> str:
        """A start-up line: each engine pool's dtype and how it was chosen."""
        return "engine dtype: " + "; ".join(
            f"{pool} " + dtype_line(self.cfg[pool].dtype, self.engine_dtype(pool),
                                    bool(self.cfg.resources[pool].gpus_per_worker))
            for pool in self.engine_pools())

    def kv_cache_line(self) -> str:
        """A start-up line: each CPU engine's KV cache and how it was chosen ("" when the
        engines have GPUs, where gpu_memory_utilization sizes it)."""
        parts = []
        for pool in self.engine_pools():
            if self.cfg.resources[pool].gpus_per_worker:
                continue
            s = self.engine_settings(pool)
            row = min((pool == "rollout" and self._rollout_row()) or s.max_model_len,
                      s.max_model_len)
            how = (f"{s.max_num_seqs} sequence(s) of the step x {row} tokens"
                   if self.cfg[pool].kv_cache_gib == 0 else f"{pool}.kv_cache_gib")
            parts.append(f"{pool} {s.kv_cache_gib * 1024:.1f} MiB ({how})")
        return "KV cache per CPU engine: " + "; ".join(parts) if parts else ""

    def _rollout_args(self, i, _):
        lora = self.cfg.model.lora
        return (self.policy_path, self.engine_settings("rollout")), {
            "seed": self.cfg.trainer.seed + i,
            "lora_rank": 0 if self._lora_merged() else lora.rank}   # base + adapter

    def _lora_merged(self) -> bool:
        """model.lora.merge resolved for where the rollout engines run; the policy and the
        engines are told the same."""
        return lora_merged(self.cfg.model.lora, bool(self.cfg.resources.rollout.gpus_per_worker))

    def _reward_model_args(self, i, _):
        c = self.cfg.reward_model
        extra = {"lora_path": c.lora_path} if c.lora_path else {}   # a kind with lora_adapter
        return (*self.reward_paths(), self.engine_settings("reward_model")), {
            "seed": self.cfg.trainer.seed, **extra}

    def _seeker_args(self, i, _):
        return (self.seeker_path(), self.engine_settings("seeker")), {
            "seed": self.cfg.trainer.seed + i}

    def _redundancy_args(self, i, _):
        return (narrow(RedundancySettings, self.cfg.algorithm.rur),), {}

    def _retrieval_args(self, i, _):
        return (self.index_dir, self.cfg.retrieval.embedding_model), {}

    def _actor_args(self, rank, rendezvous):
        a = self.cfg.actor
        # a constant, so that every micro-batch divides alike (verl's default, the mask's width,
        # changes with each micro-batch's longest row here)
        settings = replace(narrow(PolicySettings, a), loss_scale_factor=(
            a.loss_scale_factor or self.cfg.rollout.response_length))
        return (rank, a.world_size, *rendezvous, self.policy_path, settings), {
            "rollout_n": self.cfg.rollout.n, "seed": self.cfg.trainer.seed,
            "max_row_len": self.cfg.rollout.max_model_len,
            "lora_settings": replace(narrow(LoRASettings, self.cfg.model.lora),
                                     merge=str(self._lora_merged()).lower())}

    def start(self, pool: str, i: int = 0):
        """Worker i of an engine or encoder pool as a Ray actor on its bundle (also how a
        crashed one is replaced: Pools.restart)."""
        args, kwargs = self.worker_args(pool, i)
        env = engine_env() if pool in ENGINE_POOLS else _PLAIN_ENV
        return self._actor(pool, i, env).remote(*args, **kwargs)

    def actor_group(self) -> list:
        """Every policy rank, with the rendezvous on rank 0's node."""
        rendezvous = ray.get(_node_address.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.pgs["actor"], placement_group_bundle_index=0)).remote())
        # policy ranks are never restarted by Ray (max_restarts 0): a dead rank ends the step
        ranks = []
        for r in range(self.cfg.actor.world_size):
            args, kwargs = self.worker_args("actor", r, rendezvous)
            env = policy_env(self.cfg.resources.actor, self.cfg.actor.num_threads,
                             self.cfg.actor.malloc_mmap_threshold_mib)
            ranks.append(self._actor("actor", r, env, max_restarts=0).remote(
                *args, **kwargs))
        return ranks

    def make_pools(self) -> Pools:
        """Every pool's placement group, then its workers in start_waves order (an engine
        on part of a GPU starts alone), then a wait until all are up."""
        cfg, t0 = self.cfg, time.perf_counter()
        sizes = pool_sizes(cfg)            # what `peer-rl plan` places, too
        for name, n in sizes.items():
            self.pgs[name] = _pool_pg(name, cfg.resources[name], n, cfg.ray.placement_timeout_s,
                                      strategy(name))
        handles: dict[str, list] = {name: [None] * n for name, n in sizes.items()}
        waves = start_waves(sizes, cfg.resources)
        for k, wave in enumerate(waves):
            started = [] if k == 0 else [(name, h) for name, hs in handles.items()
                                         for h in hs if h is not None]
            if started:                    # the previous waves are up before this one starts
                self._wait_ready(started, t0)
            if any(name == "actor" for name, _ in wave):
                handles["actor"] = self.actor_group()
            for name, i in wave:
                if name != "actor":
                    handles[name][i] = self.start(name, i)
        pools = Pools(**{name: handles.get(name, []) for name in ORDER},
                      restart=self.start,
                      classes={name: self.worker_class(name) for name in sizes})
        self.ready_s = self._wait_ready([(name, h) for name in ORDER for h in getattr(pools, name)],
                                        t0)
        return pools

    @staticmethod
    def _wait_ready(workers: list[tuple[str, object]], t0: float) -> dict[str, float]:
        """Seconds from the start until each pool's last worker of `workers` ((pool, handle)
        pairs) was up (what a slow start-up is spent on); a constructor failure (bad model
        path, engine OOM, a GPU pool without CUDA) is raised now, naming its pool."""
        pending = {h.health.remote(): name for name, h in workers}
        left = Counter(pending.values())
        ready: dict[str, float] = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            name = pending.pop(done[0])
            try:
                ray.get(done[0])
            except ray.exceptions.RayActorError as exc:
                raise RuntimeError(f"pool {name!r} failed to start: {exc}") from None
            left[name] -= 1
            if not left[name]:
                ready[name] = time.perf_counter() - t0
        return ready

    def shutdown(self, pools: Pools | None = None) -> None:
        """Stop engines cleanly (their core processes), then free the placement groups."""
        if pools is not None:
            closing = [h.close.remote() for h in pools.rollout + pools.reward_model + pools.seeker]
            closing += [h.shutdown.remote() for h in pools.actor]
            ray.wait(closing, num_returns=len(closing), timeout=30)
            # then end the processes: a worker left to exit on its own can outlive the cluster
            for h in (pools.rollout + pools.reward_model + pools.actor + pools.redundancy
                      + pools.retrieval + pools.seeker):
                ray.kill(h, no_restart=True)
        for pg in self.pgs.values():
            remove_placement_group(pg)
        self.pgs.clear()
