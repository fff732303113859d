"""`peer-rl plan`'s printed table."""
from __future__ import annotations

from collections import Counter

from peer_rl.activation_memory import GiB
from peer_rl.planning.plan import Plan


def _gib(n: int) -> str:
    return f"{n / GiB:.1f}"


def _cluster(plan: Plan) -> str:
    kinds = Counter(plan.nodes)
    return "; ".join(f"{k} node(s) x {n.gpus} GPU(s) of {n.gpu_memory_gib:g} GiB, {n.cpus:g} CPUs"
                     for n, k in kinds.items())


def render(plan: Plan, recipe: str, cfg) -> str:
    out = [f"peer-rl plan: recipe={recipe} on {_cluster(plan)}",
           "models: " + "; ".join(f"{role} {where}" for role, where in plan.models.items()), "",
           f"{'pool':13s} {'workers':>7s}  {'bundle':18s} placed on"]
    for pool, n in plan.sizes.items():
        res = cfg.resources[pool]
        b = f"{res.cpus_per_worker:g} CPU" + (f" + {res.gpus_per_worker:g} GPU"
                                            if res.gpus_per_worker else "")
        nodes = Counter(s.node for s in plan.slots if s.pool == pool)
        where = ", ".join(f"node {k} x{c}" for k, c in sorted(nodes.items())) or "NOT PLACED"
        out.append(f"{pool:13s} {n:7d}  {b:18s} {where}")
    spans = sorted({s.node for s in plan.slots if s.pool == "actor"})
    if len(spans) > 1:
        out.append(f"note: the {plan.sizes['actor']} policy ranks span {len(spans)} nodes: every "
                   "micro-batch's gradient reduction crosses the network")
    if plan.estimates:
        out += ["", "each worker on each of its GPUs, GiB:"]
        for pool, ests in plan.estimates.items():
            for e in ests:
                parts = " + ".join(f"{k} {_gib(v)}" for k, v in e.parts.items() if v)
                out.append(f"  {pool:12s} {parts} = {_gib(e.total)}")
                if e.detail:
                    out.append(f"  {'':12s} {e.detail}")
        out += ["", "GPUs, GiB used of each:"]
        for (node, g), users in sorted(plan.gpu_use().items()):
            total = sum(b for _, b in users)
            who = " + ".join(f"{p} {_gib(b)}" for p, b in users)
            out.append(f"  node {node} GPU {g}: {who} = {_gib(total)} / "
                       f"{plan.nodes[node].gpu_memory_gib:g}")
    return "\n".join(out)
