"""Where each pool's bundles land: Ray's placement strategies replayed over the cluster's nodes
in the order the run creates its groups (peer_rl.planning.pools), and each GPU bundle given GPU
slots on its node. Nodes are scored as Ray's LeastResourceScorer scores them (the share of each
requested resource left after the bundle, summed: the least used node scores highest); PACK
fills the best node for one bundle with as much of the group as fits, then the next best;
SPREAD gives each bundle the best node the group has not used yet, then the best of those it
has. Ray chooses among equal scores its own way, so node numbers may differ; how many bundles
share a node does not (`peer-rl plan --probe` shows Ray's own map)."""
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

    def _score(self, node: int, b: dict) -> float:
        """Ray's LeastResourceScorer (src/ray/raylet/scheduling/policy/scorer.cc): over the
        bundle's resources, the sum of (available - requested) / available (0 where none is
        available); -1 where the bundle does not fit. Higher is better: the least used node."""
        if not self._fits(node, b):
            return -1.0
        score = 0.0
        for avail, need in ((self.cpus[node], b["CPU"]),
                            (sum(self.gpu_free[node]), b.get("GPU", 0.0))):
            if need and avail > EPS:
                score += (avail - need) / avail
        return score

    def _best(self, candidates, b: dict) -> int | None:
        """The highest-scoring candidate (Ray breaks ties by its hash map's order; here the
        first node)."""
        scored = [(self._score(k, b), k) for k in candidates]
        scored = [(sc, k) for sc, k in scored if sc >= 0]
        return max(scored, key=lambda t: (t[0], -t[1]))[1] if scored else None

    def place(self, pool: str, b: dict, n: int, strategy: str) -> Unplaced | None:
        """Place `n` bundles `b` of `pool` as Ray's bundle scheduling policies do
        (bundle_scheduling_policy.cc); what could not be placed (nothing placed then).
        PACK: the best node for one bundle takes as many of the group as fit, the next best
        node the rest, and so on. SPREAD: each bundle on the best node not yet used by the
        group, else the best of those it uses."""
        saved = (list(self.cpus), [list(g) for g in self.gpu_free], len(self.slots))
        candidates = list(range(len(self.nodes)))
        i = 0
        if strategy == "PACK":
            while i < n:
                k = self._best(candidates, b)
                if k is None:
                    return self._undo(saved, pool, b, n)
                while i < n and self._fits(k, b):
                    self._take(pool, i, k, b)
                    i += 1
                candidates.remove(k)
            return None
        used: list[int] = []
        for i in range(n):
            k = self._best(candidates, b)
            if k is not None:
                candidates.remove(k)
                used.append(k)
            else:
                k = self._best(used, b)
                if k is None:
                    return self._undo(saved, pool, b, n)
            self._take(pool, i, k, b)
        return None

    def _undo(self, saved, pool: str, b: dict, n: int) -> Unplaced:
        """A group is placed whole or not at all (Ray waits for all of its bundles)."""
        self.cpus, self.gpu_free = saved[0], saved[1]
        del self.slots[saved[2]:]
        return Unplaced(pool, b, n, sum(self.cpus), sum(sum(g) for g in self.gpu_free))
