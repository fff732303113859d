"""`peer-rl plan --probe`: the run's real placement groups on a running Ray cluster, with a small
actor in every bundle reporting its node, the GPU ids Ray gave it and its CPU share. No model
is loaded and no CUDA call is made, so it runs on nodes that only declare GPUs (the local
two-node cluster with HEAD_GPUS / WORKER_GPUS) as on real ones."""
from __future__ import annotations

import time
from dataclasses import dataclass

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from peer_rl.planning.pools import bundle, pool_sizes, strategy


@ray.remote(num_cpus=0)
class _Probe:
    def where(self) -> dict:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "resources": dict(ctx.get_assigned_resources())}


@dataclass
class Probed:
    pool: str
    index: int
    node: int            # index of the node in ray.nodes()' alive order (as --from-ray plans)
    gpu_ids: list[str]
    cpus: float


def in_use(wait_s: float = 30.0) -> dict[str, float]:
    """The CPUs and GPUs something holds on the cluster after waiting up to `wait_s` for them
    to be freed ({} once idle). Removing a placement group or killing an actor frees its
    resources asynchronously, so the previous probe's groups may still hold some: a probe
    placed around them would not be the empty cluster's placement that `plan` works out."""
    deadline = time.monotonic() + wait_s
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        held = {k: round(total.get(k, 0.0) - free.get(k, 0.0), 3) for k in ("CPU", "GPU")}
        held = {k: v for k, v in held.items() if v > 1e-6}
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.25)


def probe(cfg, timeout_s: float = 20.0) -> tuple[list[Probed], str]:
    """Place every pool of `cfg` as the run does (an already initialised Ray), probe each
    bundle, remove everything; (the probes, "" or the pool that could not be placed)."""
    order = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    pgs, actors, found, refused = [], [], [], ""
    try:
        for pool, n in pool_sizes(cfg).items():
            res = cfg.resources[pool]
            pg = placement_group([bundle(res)] * n, strategy=strategy(pool),
                                 name=f"peer-rl-probe-{pool}")
            pgs.append(pg)
            ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
            if not ready:
                refused = (f"resources.{pool}: {n} x {bundle(res)} could not be placed within "
                           f"{timeout_s:g} s; cluster resources {ray.cluster_resources()}")
                break
            for i in range(n):
                a = _Probe.options(
                    num_cpus=res.cpus_per_worker, num_gpus=res.gpus_per_worker,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=i)).remote()
                actors.append((pool, i, a))
        for pool, i, a in actors:
            w = ray.get(a.where.remote(), timeout=120)
            found.append(Probed(pool, i, order.index(w["node_id"]), w["gpu_ids"],
                                w["resources"].get("CPU", 0.0)))
    finally:
        for *_, a in actors:
            ray.kill(a)
        for pg in pgs:
            remove_placement_group(pg)
    return found, refused


def node_map(pairs) -> list[dict[str, int]]:
    """Per node, how many bundles of each pool it holds, sorted: equal for two placements that
    differ only in which of several equal nodes Ray chose."""
    nodes: dict[int, dict[str, int]] = {}
    for pool, node in pairs:
        nodes.setdefault(node, {}).setdefault(pool, 0)
        nodes[node][pool] += 1
    return sorted(nodes.values(), key=lambda d: sorted(d.items()))
