"""`peer-rl plan --from-ray ... --probe` on the local two-node cluster of
cluster/start-local-cluster.sh whose nodes declare 4 GPUs each that they do not have: Ray's own
placement of the run (real placement groups, a probe actor in every bundle) against the plan's,
for recipes at a size that fits and at their shipped size, which does not."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from cluster_util import REPO, started_cluster

pytestmark = pytest.mark.e2e

SHAPES = ["model.path=SmolLM2-135M", "reward_model.path=SmolLM2-135M"]


@pytest.fixture(scope="module")
def gpu_cluster():
    with started_cluster(HEAD_GPUS="4", WORKER_GPUS="4", HEAD_CPUS="16",
                         WORKER_CPUS="16") as cluster:
        yield cluster


def _plan(cluster, *args: str, timeout_s: float = 20) -> subprocess.CompletedProcess:
    address = f"127.0.0.2:{cluster.env['RAY_PORT']}"
    return subprocess.run([sys.executable, "-m", "peer_rl.cli", "plan", "--from-ray", address,
                           "--probe", "--probe-timeout", f"{timeout_s:g}", *args], env=cluster.env, cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def _probed(out: str) -> list[tuple[str, int, list[str]]]:
    rows = re.findall(r"^  (\w+) +\d+  node (\d+)(?: GPU ids ([\d,]+))?  CPU", out, re.M)
    return [(pool, int(node), ids.split(",") if ids else []) for pool, node, ids in rows]


@pytest.mark.parametrize("recipe, sizes", [
    ("peer", ["rollout.num_workers=2", "reward_model.num_workers=1", "actor.world_size=2"]),
    ("peer_rur", ["rollout.num_workers=2", "reward_model.num_workers=1", "actor.world_size=4",
                  "resources.reward_model.gpus_per_worker=0.5"]),
    ("escrag_r1", ["rollout.num_workers=2", "reward_model.num_workers=2",
                   "actor.world_size=2"]),
])
def test_the_probe_places_what_the_plan_says(gpu_cluster, recipe, sizes):
    proc = _plan(gpu_cluster, f"recipe={recipe}", *SHAPES, *sizes)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "the cluster is in use" not in proc.stdout, proc.stdout     # the last probe's freed
    assert "probe matches the plan's GPU bundles per node" in proc.stdout, proc.stdout
    probed = _probed(proc.stdout)
    assert probed
    shared = {s.split(".")[1] for s in sizes if s.endswith("gpus_per_worker=0.5")}
    by_node: dict[int, list[str]] = {}
    for pool, node, ids in probed:
        if pool not in shared:
            by_node.setdefault(node, []).extend(ids)
    assert any(by_node.values())
    for node, ids in by_node.items():       # whole-GPU bundles never share a GPU id
        assert len(ids) == len(set(ids)), (node, ids)
    ranks = {node for pool, node, _ in probed if pool == "actor"}
    wanted = int(next(s for s in sizes if s.startswith("actor.")).split("=")[1])
    assert sum(pool == "actor" for pool, _, _ in probed) == wanted
    if wanted <= 2:
        assert len(ranks) == 1               # packed: the policy's ranks share a node


@pytest.mark.parametrize("recipe, extra", [("peer_rur", []),
                                           ("escrag_r1", ["actor.world_size=8"])])
def test_a_recipe_too_big_for_the_cluster_is_refused_by_plan_and_by_ray(gpu_cluster, recipe,
                                                                         extra):
    """peer_rur as shipped asks for 14 GPUs (peer's GPU pools are the same: it is not probed
    again), escrag_r1 with 8 policy ranks for 10; the cluster has 8."""
    proc = _plan(gpu_cluster, f"recipe={recipe}", *SHAPES, *extra, timeout_s=4)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    refused = proc.stdout.split("\nrefused:\n")[1]
    assert re.search(r"resources\.(actor|rollout|reward_model): \d+ x .* cannot be placed",
                     refused), refused
    pool = re.search(r"resources\.(\w+): \d+ x", refused).group(1)
    assert f"refused by Ray: resources.{pool}:" in proc.stdout
    assert "could not be placed within 4 s" in proc.stdout
