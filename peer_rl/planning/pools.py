"""Which pools a run starts, how many workers each, and the placement strategy of each pool's
group: one source for the trainer's placement layer (peer_rl.trainer.resource_pools.make_pools) and
the planner, so a plan places exactly what a run would."""
from __future__ import annotations

from peer_rl.methods import method_class

# the order make_pools creates the pools' placement groups in (Ray places them in that order)
ORDER = ("rollout", "reward_model", "actor", "redundancy", "retrieval", "seeker")
# the rollout engines spread over nodes (their KV caches and samplers are independent); every
# other pool packs its bundles (policy ranks talk over NCCL on every micro-batch)
STRATEGY = {"rollout": "SPREAD"}


def pool_sizes(cfg) -> dict[str, int]:
    """pool -> workers: the method's pools (what its scoring calls), the policy's, and the
    encoder the in-training evaluation measures diversity with, in creation order."""
    needs = method_class(cfg).pools(cfg) | {"actor"}
    if cfg.trainer.eval_freq > 0:
        needs.add("redundancy")
    count = {"rollout": cfg.rollout.num_workers, "reward_model": cfg.reward_model.num_workers,
             "actor": cfg.actor.world_size, "redundancy": 1,
             "retrieval": cfg.retrieval.num_workers, "seeker": cfg.seeker.num_workers}
    return {name: count[name] for name in ORDER if name in needs}


def strategy(pool: str) -> str:
    return STRATEGY.get(pool, "PACK")


def bundle(res) -> dict:
    """One worker's placement bundle from resources.<pool>."""
    b = {"CPU": float(res.cpus_per_worker)}
    if res.gpus_per_worker:
        b["GPU"] = float(res.gpus_per_worker)
    return b


ENGINE_POOLS = ("rollout", "reward_model", "seeker")     # their workers run vLLM


def start_waves(sizes: dict[str, int], resources) -> list[list[tuple[str, int]]]:
    """The workers of `sizes` (pool_sizes) in the groups they start in, in order: a group starts
    once every worker of the group before it is ready.

    Why: vLLM counts every byte allocated on its device while it profiles at start-up as its
    own (vllm/v1/worker/gpu_worker.py, determine_available_memory), so an engine that starts
    beside another allocating on the same GPU finds no room for its KV cache. Only a bundle
    holding part of a GPU (0 < resources.<pool>.gpus_per_worker < 1) can share one, so each
    engine on such a bundle starts alone, after everything before it is up; all other workers
    start together, as do a pool's policy ranks (they meet in one rendezvous)."""
    waves: list[list[tuple[str, int]]] = [[]]
    for pool in ORDER:
        gpus = float(resources[pool].gpus_per_worker) if pool in sizes else 0.0
        for i in range(sizes.get(pool, 0)):
            if pool in ENGINE_POOLS and 0 < gpus < 1:
                waves += [[(pool, i)], []]
            else:
                waves[-1].append((pool, i))
    return [w for w in waves if w]
