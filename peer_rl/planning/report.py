"""`peer-rl plan`'s printed table."""
from __future__ import annotations

from collections import Counter

from peer_rl.compute.activation_memory import GiB
from peer_rl.config.schema import ConfigError, load_config
from peer_rl.planning.cluster import Node
from peer_rl.planning.plan import Plan, fitting_fixes, make_plan


def _gib(n: int) -> str:
    return f"{n / GiB:.1f}"


def _cluster(plan: Plan) -> str:
    kinds = Counter(plan.nodes)
    return "; ".join(f"{k} node(s) x {n.gpus} GPU(s) of {n.gpu_memory_gib:g} GiB, {n.cpus:g} CPUs"
                     for n, k in kinds.items())


def render(plan: Plan, recipe: str, cfg=None, note: str = "") -> str:
    """The plan as printed: the cluster (and `note`, what the recipe runs as), the models, each
    pool's bundles and nodes, each worker's memory by part and each GPU's total."""
    out = [f"peer-rl plan: recipe={recipe} on {_cluster(plan)}", *([note] if note else []),
           "models: " + "; ".join(f"{role} {where}" for role, where in plan.models.items()), "",
           f"{'pool':13s} {'workers':>7s}  {'bundle':18s} placed on"]
    for pool, n in plan.sizes.items():
        b = plan.bundles[pool]
        cpu_gpu = f"{b['CPU']:g} CPU" + (f" + {b['GPU']:g} GPU" if b.get("GPU") else "")
        nodes = Counter(s.node for s in plan.slots if s.pool == pool)
        where = ", ".join(f"node {k} x{c}" for k, c in sorted(nodes.items())) or "NOT PLACED"
        out.append(f"{pool:13s} {n:7d}  {cpu_gpu:18s} {where}")
    spans = sorted({s.node for s in plan.slots if s.pool == "actor"})
    if len(spans) > 1:
        out.append(f"note: the {plan.sizes['actor']} policy ranks span {len(spans)} nodes: every "
                   "micro-batch's gradient reduction crosses the network")
    if plan.estimates and not any(plan.bundles[p].get("GPU") for p in plan.estimates):
        # workers on CPUs only (a supervised stage's; a GRPO plan sizes GPU workers alone)
        out += ["", "each worker in host memory (CPU), GiB:"] + estimate_lines(plan.estimates)
    elif plan.estimates:
        out += ["", "each worker on each of its GPUs, GiB:"]
        out += estimate_lines(plan.estimates)
        out += ["", "GPUs, GiB used of each:"]
        for (node, g), users in sorted(plan.gpu_use().items()):
            total = sum(b for _, b in users)
            who = " + ".join(f"{p} {_gib(b)}" for p, b in users)
            out.append(f"  node {node} GPU {g}: {who} = {_gib(total)} / "
                       f"{plan.nodes[node].gpu_memory_gib:g}")
    return "\n".join(out)


def estimate_lines(estimates: dict) -> list[str]:
    """Each worker's estimate by part, GiB, and its detail line."""
    out = []
    for pool, ests in estimates.items():
        for e in ests:
            parts = " + ".join(f"{k} {_gib(v)}" for k, v in e.parts.items() if v)
            out.append(f"  {pool:12s} {parts} = {_gib(e.total)}")
            if e.detail:
                out.append(f"  {'':12s} {e.detail}")
    return out


# the clusters `peer-rl plan --table` sizes a recipe for: nodes x GPUs per node, GPU memory
TABLE_NODES, TABLE_GIB = (1, 2, 4), (80, 141)


def sizing_table(overrides: list[str], gpus_per_node: int = 8, cpus_per_node: float = 64) -> str:
    """A Markdown table of the recipe planned on 1, 2 and 4 nodes of `gpus_per_node` GPUs of 80
    and 141 GiB: whether it fits, how many GPUs it uses and its busiest GPU's estimate, or what
    refuses it and the first setting that makes it fit."""
    cfg = load_config(overrides)
    rows = [f"| nodes x GPUs | {' | '.join(f'{g} GiB GPUs' for g in TABLE_GIB)} |",
            "| --- |" + " --- |" * len(TABLE_GIB)]
    for n in TABLE_NODES:
        cells = []
        for gib in TABLE_GIB:
            nodes = [Node(cpus=cpus_per_node, gpus=gpus_per_node, gpu_memory_gib=gib)] * n
            plan = make_plan(cfg, nodes)
            use = {gpu: sum(b for _, b in users) for gpu, users in plan.gpu_use().items()}
            if plan.fits:
                cells.append(f"fits: {len(use)} of {n * gpus_per_node} GPUs, busiest "
                             f"{max(use.values(), default=0) / GiB:.1f} GiB"
                             + _scaled_up(cfg, overrides, nodes, len(use)))
                continue
            fixes = fitting_fixes(overrides, nodes, plan, limit=1)
            why = plan.problems[0].split(":", 1)[0]
            cells.append(f"refused ({why})" + (f"; fits with `{' '.join(fixes[0])}`" if fixes
                                               else "; no setting tried fits"))
        rows.append(f"| {n} x {gpus_per_node} | {' | '.join(cells)} |")
    return "\n".join(rows)


def _scaled_up(cfg, overrides: list[str], nodes, used: int) -> str:
    """Where GPUs stay idle: the largest whole multiple (4, 3, 2) of the rollout engines, judge
    engines and policy ranks that still fits, as the settings to give."""
    if used >= sum(n.gpus for n in nodes):
        return ""
    for k in (4, 3, 2):
        more = [f"rollout.num_workers={cfg.rollout.num_workers * k}",
                f"reward_model.num_workers={cfg.reward_model.num_workers * k}",
                f"actor.world_size={cfg.actor.world_size * k}"]
        try:
            plan = make_plan(load_config(list(overrides) + more), nodes)
        except ConfigError:
            continue
        if plan.fits:
            return f"; x{k} fits (`{' '.join(more)}`, {len(plan.gpu_use())} GPUs)"
    return ""
