"""The cluster a plan is made for: nodes with CPUs, GPUs and GPU memory, from a YAML file, from
`nodes=... gpus_per_node=...` overrides, or from a running Ray cluster (`--from-ray`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from peer_rl.config.schema import MAX_CPUS_PER_NODE, MAX_GPU_MEMORY_GIB, MAX_GPUS_PER_NODE, MAX_NODES

KEYS = ("nodes", "gpus_per_node", "gpu_memory_gib", "cpus_per_node")


@dataclass(frozen=True)
class Node:
    cpus: float
    gpus: int
    gpu_memory_gib: float


def _within(key: str, value: float, high: float, zero: bool = False) -> None:
    """`value` finite, above 0 (or 0 where `zero`) and at most `high`, else ValueError naming
    `key`."""
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0) and value <= high):
        raise ValueError(f"{key}={value}: expected {'0' if zero else 'a number above 0'} to "
                         f"{high}")


def check_node(node: Node, where: str = "") -> Node:
    """A node's numbers within what a machine has (CPUs and GPU memory above 0, GPUs 0 or
    more, none above the MAX_ bounds); `where` prefixes the keys an error names."""
    _within(f"{where}cpus", node.cpus, MAX_CPUS_PER_NODE)
    _within(f"{where}gpus", node.gpus, MAX_GPUS_PER_NODE, zero=True)
    _within(f"{where}gpu_memory_gib", node.gpu_memory_gib, MAX_GPU_MEMORY_GIB)
    return node


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
    _within("nodes", n, MAX_NODES)          # before the list of them is made
    _within("cpus_per_node", node.cpus, MAX_CPUS_PER_NODE)
    _within("gpus_per_node", node.gpus, MAX_GPUS_PER_NODE, zero=True)
    _within("gpu_memory_gib", node.gpu_memory_gib, MAX_GPU_MEMORY_GIB)
    return [node] * n


def from_file(path: str | Path) -> list[Node]:
    """A YAML file: `nodes:` a list of {count, cpus, gpus, gpu_memory_gib} groups."""
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
            node = Node(float(g["cpus"]), int(g.get("gpus", 0)),
                        float(g.get("gpu_memory_gib", 80)))
            count = int(g.get("count", 1))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ValueError(f"cluster={path}: nodes[{k}]: expected cpus, gpus, gpu_memory_gib "
                             f"and count ({exc!r})") from None
        check_node(node, f"cluster={path}: nodes[{k}].")
        if not 0 <= count <= MAX_NODES - len(nodes):
            raise ValueError(f"cluster={path}: nodes[{k}].count={count}: expected 0 to "
                             f"{MAX_NODES - len(nodes)} (at most {MAX_NODES} nodes in all)")
        nodes += [node] * count
    if not nodes:
        raise ValueError(f"cluster={path}: no nodes (every count is 0)")
    return nodes


def from_ray(gpu_memory_gib: float = 80.0) -> list[Node]:
    """The alive nodes of the Ray cluster this process is connected to, in ray.nodes()' order;
    Ray does not know a GPU's memory, so `gpu_memory_gib` says it."""
    import ray  # deferred: ray (~1 s); commands that start no cluster run without it

    _within("gpu_memory_gib", gpu_memory_gib, MAX_GPU_MEMORY_GIB)

    return [Node(n["Resources"].get("CPU", 0.0), int(n["Resources"].get("GPU", 0)),
                 gpu_memory_gib) for n in ray.nodes() if n.get("Alive")]
