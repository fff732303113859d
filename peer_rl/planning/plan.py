"""A run's plan on a cluster: every pool's bundles placed (peer_rl.planning.placement), each
worker's memory on its GPUs (peer_rl.planning.memory), the GPUs summed, and what does not fit.
When something does not fit, settings that would are looked for by planning again with each
candidate change, so every suggestion printed is one this planner accepts."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from peer_rl.compute.activation_memory import GiB
from peer_rl.config.reward_kinds import reward_kind
from peer_rl.config.schema import ConfigError, load_config as load
from peer_rl.models.local import BUNDLED
from peer_rl.planning import memory
from peer_rl.planning.cluster import Node
from peer_rl.planning.placement import Placement, Slot, Unplaced
from peer_rl.planning.pools import bundle, pool_sizes, strategy
from peer_rl.planning.shapes import model_shape


@dataclass
class Plan:
    nodes: list[Node]
    sizes: dict[str, int]
    slots: list[Slot]
    unplaced: list[Unplaced]
    estimates: dict[str, list[memory.Estimate]]     # pool -> one per engine inside a worker
    models: dict[str, str]                           # role -> where its shape came from
    problems: list[str] = field(default_factory=list)
    bundles: dict[str, dict] = field(default_factory=dict)    # pool -> one worker's bundle

    @property
    def fits(self) -> bool:
        return not self.problems

    def gpu_use(self) -> dict[tuple[int, int], list[tuple[str, int]]]:
        """(node, GPU index) -> [(pool, bytes)] of every worker that holds memory there."""
        use: dict[tuple[int, int], list[tuple[str, int]]] = {}
        for s in self.slots:
            for g in s.gpus:
                for est in self.estimates.get(s.pool, []):
                    use.setdefault((s.node, g), []).append((s.pool, est.total))
        return use


def _more_reward_models(cfg) -> dict[str, str]:
    """role -> reward_model key of each model a reward engine loads beside the judge (path):
    its kind's others, named by their key (outcome_path: outcome)."""
    keys = reward_kind(cfg.reward_model.kind).models[1:]
    return {key.removesuffix("_path"): key for key in keys}


def _models(cfg) -> dict[str, str]:
    """role -> model directory or named shape: the recipe's, else the shipped tiny ones."""
    shipped = BUNDLED / "models" / "tiny"       # what a run without model paths trains
    rm = cfg.reward_model
    out = {"policy": cfg.model.path or str(shipped / "policy"),
           "judge": rm.path or str(shipped / "judge")}
    if cfg.dialogue.enable:          # the simulated seeker: seeker.path, else the policy's
        out["seeker"] = cfg.seeker.path or out["policy"]
    return out | {role: rm[key] for role, key in _more_reward_models(cfg).items()}


def make_plan(cfg, nodes: list[Node]) -> Plan:
    """Place the run's pools on `nodes` and estimate what each GPU holds."""
    sizes = pool_sizes(cfg)
    placement, unplaced = Placement(nodes), []
    for pool, n in sizes.items():
        missing = placement.place(pool, bundle(cfg.resources[pool]), n, strategy(pool))
        if missing is not None:
            unplaced.append(missing)
    gpu_gib = min(n.gpu_memory_gib for n in nodes)
    roles = _models(cfg)
    shapes = {role: model_shape(spec) for role, spec in roles.items()}
    estimates: dict[str, list[memory.Estimate]] = {}
    for pool in sizes:
        if not cfg.resources[pool].gpus_per_worker:
            continue
        estimates[pool] = _estimates(cfg, pool, shapes, gpu_gib)
    plan = Plan(nodes, sizes, placement.slots, unplaced, estimates,
                {role: s[3] for role, s in shapes.items()},
                bundles={pool: bundle(cfg.resources[pool]) for pool in sizes})
    check_fit(plan)
    return plan


def check_fit(plan: Plan) -> None:
    """plan.problems: what could not be placed, each worker's own problem, and every GPU its
    workers together overfill."""
    nodes = plan.nodes
    for u in plan.unplaced:
        plan.problems.append(
            f"resources.{u.pool}: {u.count} x {u.bundle} cannot be placed ({u.free_gpus:g} GPU(s) "
            f"and {u.free_cpus:g} CPU(s) left after the pools before it, of "
            f"{sum(n.gpus for n in nodes)} GPU(s) and {sum(n.cpus for n in nodes):g} CPU(s))")
    for pool, ests in plan.estimates.items():
        plan.problems += [f"{pool}: {e.problem}" for e in ests if e.problem]
    for (node, g), users in sorted(plan.gpu_use().items()):
        total = sum(b for _, b in users)
        if total > nodes[node].gpu_memory_gib * GiB:
            who = " + ".join(f"{p} {b / GiB:.1f}" for p, b in users)
            plan.problems.append(f"node {node} GPU {g}: {who} = {total / GiB:.1f} GiB > "
                                 f"{nodes[node].gpu_memory_gib:g} GiB "
                                 f"({(total / GiB - nodes[node].gpu_memory_gib):.1f} GiB short)")


def _estimates(cfg, pool: str, shapes: dict, gpu_gib: float) -> list[memory.Estimate]:
    if pool == "actor":
        config, params, vision, _ = shapes["policy"]
        return [memory.policy_rank(config, params, vision, cfg.actor, cfg.model.lora, gpu_gib)]
    if pool == "rollout":
        config, params, _, _ = shapes["policy"]
        r = cfg.rollout
        return [memory.engine("rollout", config, params, r.max_model_len,
                              r.gpu_memory_utilization, gpu_gib, r.tensor_model_parallel_size)]
    if pool == "reward_model":
        rm = cfg.reward_model
        roles = ("judge", *_more_reward_models(cfg))
        share = rm.gpu_memory_utilization / len(roles)   # two engines in one actor split it
        return [memory.engine("reward_model", shapes[r][0], shapes[r][1], rm.max_model_len,
                              share, gpu_gib) for r in roles]
    if pool == "seeker":
        s = cfg.seeker
        config, params, _, _ = shapes["seeker"]
        return [memory.engine("seeker", config, params, s.max_model_len,
                              s.gpu_memory_utilization, gpu_gib)]
    return [memory.encoder(pool)]


def candidate_fixes(cfg, plan: Plan) -> list[list[str]]:
    """Changes that may make `plan` fit, most training capacity first: policy ranks (most
    first), then rollout engines (most first), the judge alone or on half a GPU beside another
    pool; each combined with no memory change, then tensor-parallel engines, LoRA,
    recomputation, half the token budget or the reference offloaded."""
    sizes = plan.sizes
    layouts: list[list[str]] = [[]]
    if plan.unplaced:
        ranks = [cfg.actor.world_size]
        while ranks[-1] > 1:
            ranks.append(ranks[-1] // 2)
        engines = list(range(sizes.get("rollout", 1), 0, -1))
        shares: list[list[str]] = [[]]
        if "reward_model" in sizes and cfg.resources.reward_model.gpus_per_worker >= 1:
            shares.append(["resources.reward_model.gpus_per_worker=0.5",
                           "reward_model.gpu_memory_utilization="
                           f"{min(0.45, cfg.reward_model.gpu_memory_utilization):g}"])
        layouts = []
        for w in ranks:
            for n in engines:
                for share in shares:
                    change = ([f"actor.world_size={w}"] if w != cfg.actor.world_size else []) \
                        + ([f"rollout.num_workers={n}"] if n != sizes.get("rollout") else []) \
                        + share
                    if change:
                        layouts.append(change)
    memory_fixes: list[list[str]] = [[]]
    if any(e.problem for e in plan.estimates.get("rollout", [])):
        memory_fixes += [["rollout.tensor_model_parallel_size=2",
                          "resources.rollout.gpus_per_worker=2"],
                         ["rollout.gpu_memory_utilization="
                          f"{min(0.9, cfg.rollout.gpu_memory_utilization + 0.2):g}"]]
    budget = cfg.actor.ppo_max_token_len_per_gpu
    memory_fixes += [["model.lora.rank=64"], ["actor.gradient_checkpointing=true"],
                     [f"actor.ppo_max_token_len_per_gpu={max(1024, budget // 2)}"],
                     ["actor.ref_param_offload=true"],
                     ["model.lora.rank=64", "actor.gradient_checkpointing=true"]]
    return [layout + fix for layout in layouts for fix in memory_fixes if layout + fix]


def first_fitting(candidates, fits: Callable[[list[str]], bool],
                  limit: int = 3) -> list[list[str]]:
    """Up to `limit` of `candidates` (lists of overrides) for which `fits` holds, each planned
    again by it; one that only adds to a change already found is left out, one the config
    refuses is skipped."""
    found: list[list[str]] = []
    for fix in candidates:
        if any(set(f) <= set(fix) for f in found):     # a smaller change already fits
            continue
        try:
            if fits(fix):
                found.append(fix)
        except ConfigError:
            continue
        if len(found) >= limit:
            break
    return found


def fitting_fixes(overrides: list[str], nodes: list[Node], plan: Plan,
                  limit: int = 3) -> list[list[str]]:
    """Up to `limit` candidate changes (candidate_fixes) with which the plan fits."""
    return first_fitting(candidate_fixes(load(overrides), plan),
                         lambda fix: make_plan(load(list(overrides) + fix), nodes).fits, limit)
