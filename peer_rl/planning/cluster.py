"""The cluster a plan is made for: nodes with CPUs, GPUs and GPU memory, from a YAML file, from
`nodes=... gpus_per_node=...` overrides, or from a running Ray cluster (`--from-ray`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KEYS = ("nodes", "gpus_per_node", "gpu_memory_gib", "cpus_per_node")


@dataclass(frozen=True)
class Node:
    cpus: float
    gpus: int
    gpu_memory_gib: float


def from_overrides(values: dict) -> list[Node]:
    """nodes=2 gpus_per_node=8 gpu_memory_gib=80 cpus_per_node=64 (every node alike)."""
    unknown = set(values) - set(KEYS)
    if unknown:
        raise ValueError(f"cluster: unknown key(s) {sorted(unknown)}; expected {', '.join(KEYS)}")
    try:
        n = int(values.get("nodes", 1))
        node = Node(cpus=float(values.get("cpus_per_node", 64)),
                    gpus=int(values.get("gpus_per_node", 8)),
                    gpu_memory_gib=float(values.get("gpu_memory_gib", 80)))
    except ValueError as exc:
        raise ValueError(f"cluster: expected numbers for {', '.join(KEYS)} ({exc})") from None
    if n < 1 or node.gpus < 0 or node.cpus <= 0 or node.gpu_memory_gib <= 0:
        raise ValueError("cluster: expected nodes >= 1, cpus_per_node > 0, gpus_per_node >= 0 "
                         "and gpu_memory_gib > 0")
    return [node] * n


def from_file(path: str | Path) -> list[Node]:
    """A YAML file: `nodes:` a list of {count, cpus, gpus, gpu_memory_gib} groups."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"cluster={path}: not a readable YAML file ({exc})") from None
    groups = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(groups, list) or not groups:
        raise ValueError(f"cluster={path}: expected `nodes:` a list of {{count, cpus, gpus, "
                         "gpu_memory_gib}}")
    nodes = []
    for k, g in enumerate(groups):
        try:
            nodes += [Node(float(g["cpus"]), int(g.get("gpus", 0)),
                           float(g.get("gpu_memory_gib", 80)))] * int(g.get("count", 1))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"cluster={path}: nodes[{k}]: expected cpus, gpus, gpu_memory_gib "
                             f"and count ({exc!r})") from None
    return nodes


def from_ray(gpu_memory_gib: float = 80.0) -> list[Node]:
    """The alive nodes of the Ray cluster this process is connected to, in ray.nodes()' order;
    Ray does not know a GPU's memory, so `gpu_memory_gib` says it."""
    import ray

    return [Node(n["Resources"].get("CPU", 0.0), int(n["Resources"].get("GPU", 0)),
                 gpu_memory_gib) for n in ray.nodes() if n.get("Alive")]
