"""Where each pool's bundles land: Ray's placement strategies replayed over the cluster's nodes
in the order the run creates its groups (peer_rl.planning.pools), and each GPU bundle given GPU
slots on its node. PACK puts a group on the least used node that holds it whole, else fills
the least used nodes first; SPREAD puts each bundle on the node holding fewest of the group's bundles so far. Ray
chooses among equal nodes its own way, so node numbers may differ; how many bundles share a node
does not (`peer-rl plan --probe` shows Ray's own map)."""
from __future__ import annotations

from dataclasses import dataclass, field

from peer_rl.planning.cluster import Node

EPS = 1e-9


@dataclass
class Slot:
    """A bundle placed: its node, and the GPU indices it shares (fraction of each)."""
    pool: str
    index: int
    node: int
    cpus: float
    gpus: dict[int, float] = field(default_factory=dict)   # GPU index on the node -> share


@dataclass
class Unplaced:
    pool: str
    bundle: dict
    count: int
    free_cpus: float
    free_gpus: float


class Placement:
    def __init__(self, nodes: list[Node]):
        self.nodes = nodes
        self.cpus = [n.cpus for n in nodes]
        self.gpu_free = [[1.0] * n.gpus for n in nodes]      # per GPU: unclaimed share
        self.slots: list[Slot] = []

    def _fits(self, node: int, b: dict, k: int = 1) -> bool:
        need_g = b.get("GPU", 0.0)
        if self.cpus[node] + EPS < k * b["CPU"]:
            return False
        if not need_g:
            return True
        if need_g >= 1:
            return sum(f >= 1 - EPS for f in self.gpu_free[node]) >= k * int(need_g)
        # fractions first-fit into GPUs' remaining shares
        free = list(self.gpu_free[node])
        for _ in range(k):
            j = next((j for j, f in enumerate(free) if f + EPS >= need_g), None)
            if j is None:
                return False
            free[j] -= need_g
        return True

    def _take(self, pool: str, i: int, node: int, b: dict) -> Slot:
        self.cpus[node] -= b["CPU"]
        gpus, need = {}, b.get("GPU", 0.0)
        free = self.gpu_free[node]
        if need >= 1:
            for j in [j for j, f in enumerate(free) if f >= 1 - EPS][:int(need)]:
                free[j], gpus[j] = 0.0, 1.0
        elif need:
            j = next(j for j, f in enumerate(free) if f + EPS >= need)
            free[j] -= need
            gpus[j] = need
        slot = Slot(pool, i, node, b["CPU"], gpus)
        self.slots.append(slot)
        return slot

    def place(self, pool: str, b: dict, n: int, strategy: str) -> Unplaced | None:
        """Place `n` bundles `b` of `pool`; what could not be placed (nothing placed then)."""
        saved = (list(self.cpus), [list(g) for g in self.gpu_free], len(self.slots))
        nodes = range(len(self.nodes))
        if strategy == "PACK":
            # of the nodes that hold the group whole, the least used one (as Ray's scheduler
            # chose on the local two-node cluster), the first on a tie
            whole = min((k for k in nodes if self._fits(k, b, n)),
                        key=lambda k: (-sum(self.gpu_free[k]), -self.cpus[k], k), default=None)
            order = [whole] * n if whole is not None else None
            if order is None:      # spilled: the least used nodes filled first
                order, i = [], 0
                for k in sorted(nodes, key=lambda k: (-sum(self.gpu_free[k]), -self.cpus[k], k)):
                    while i < n and self._fits(k, b):
                        self._take(pool, i, k, b)
                        order.append(k)
                        i += 1
                if i == n:
                    return None
                return self._undo(saved, pool, b, n)
            for i, k in enumerate(order):
                self._take(pool, i, k, b)
            return None
        counts = [0] * len(self.nodes)
        for i in range(n):
            fit = [k for k in nodes if self._fits(k, b)]
            if not fit:
                return self._undo(saved, pool, b, n)
            k = min(fit, key=lambda k: (counts[k], k))
            self._take(pool, i, k, b)
            counts[k] += 1
        return None

    def _undo(self, saved, pool: str, b: dict, n: int) -> Unplaced:
        """A group is placed whole or not at all (Ray waits for all of its bundles)."""
        self.cpus, self.gpu_free = saved[0], saved[1]
        del self.slots[saved[2]:]
        return Unplaced(pool, b, n, sum(self.cpus), sum(sum(g) for g in self.gpu_free))
