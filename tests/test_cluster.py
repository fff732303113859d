"""cluster/: the job runtime env, the launcher and KubeRay specs, and a real two-node local run.

Fast tests check the three YAML files against what the installed Ray (and KubeRay's CRD fields)
accept. The e2e test starts a two-node Ray cluster on loopback addresses (two `ray start --block`
processes, on 127.0.0.2 and 127.0.0.3, dashboard on 127.0.0.1, 1 CPU each, so the tiny recipe's
1.5 CPUs must span both nodes), submits the command docs/cluster.md gives a user, as written
(the default recipe, its shipped tiny models reaching the job through the uploaded working dir),
checks the job's result and its output directory, and stops exactly the processes it started.
"""
from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
import time
import uuid
import zipfile
from pathlib import Path

import pytest
import yaml

import ray
from peer_rl.config.schema import load_config

from cluster_util import CLUSTER, REPO
# Loopback addresses, but not 127.0.0.1: `ray start` rewrites 127.0.0.1 / localhost (in --address
# and --node-ip-address) to the machine's interface address unless
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and with that setting a non-head `ray start` aborts
# ("Multi-node Ray clusters are not supported on Windows and OSX"). Other 127/8 addresses are
# kept as given (Linux routes all of 127/8 to the loopback device).
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"


def _load(name: str):
    return yaml.safe_load((CLUSTER / name).read_text(encoding="utf-8"))


def _demand(cfg) -> dict[str, float]:
    """CPUs and GPUs the placement groups of a resolved config ask for (peer_rl/trainer/resource_pools.py)."""
    sizes = {"rollout": cfg.rollout.num_workers, "reward_model": cfg.reward_model.num_workers,
             "actor": cfg.actor.world_size}
    if cfg.algorithm.rur.enable:
        sizes["redundancy"] = 1
    return {"CPU": sum(n * cfg.resources[p].cpus_per_worker for p, n in sizes.items()),
            "GPU": sum(n * cfg.resources[p].gpus_per_worker for p, n in sizes.items())}


# ------------------------------------------------------------------ fast: the YAML files

def test_runtime_env_is_accepted_by_ray():
    from ray.runtime_env import RuntimeEnv
    from ray.runtime_env.runtime_env import RuntimeEnvConfig, _merge_runtime_env

    env = _load("runtime_env.yaml")
    # RuntimeEnv(**env) takes unknown keys as plugin fields: check the names ourselves
    assert set(env) <= RuntimeEnv.known_fields, set(env) - RuntimeEnv.known_fields
    assert set(env.get("config", {})) <= RuntimeEnvConfig.known_fields
    parsed = RuntimeEnv(**env)  # validates env_vars (str -> str), excludes, config
    assert parsed["env_vars"]["HF_HUB_OFFLINE"] == "1"
    assert parsed["env_vars"]["TOKENIZERS_PARALLELISM"] == "false"
    assert {".git", ".venv"} <= set(env["excludes"])
    assert "working_dir" not in env and "pip" not in env  # code from --working-dir, deps on nodes
    # inside a job, `peer-rl train` calls ray.init(runtime_env={"env_vars": {"PYTHONPATH": ...}});
    # Ray refuses the merge (ValueError at ray.init) when the job env sets the same variable
    assert _merge_runtime_env(parsed, {"env_vars": {"PYTHONPATH": "/x"}}) is not None


def test_runtime_env_upload_holds_the_code_and_excludes_venv_git_outputs(tmp_path):
    """The zip `ray job submit --working-dir .` would upload (Ray's own packaging code)."""
    from ray._private.runtime_env.packaging import create_package

    env = _load("runtime_env.yaml")
    pkg = tmp_path / "pkg.zip"
    create_package(str(REPO), pkg, include_gitignore=True, excludes=env["excludes"])
    names = set(zipfile.ZipFile(pkg).namelist())
    for need in ("peer_rl/cli/__init__.py", "peer_rl/trainer/resource_pools.py", "workers/rollout.py",
                 "recipes/tiny.yaml", "recipes/peer_rur.yaml",
                 "peer_rl/bundled/data/grpo/textual.jsonl",
                 "cluster/runtime_env.yaml"):
        assert need in names, need
    bad = [n for n in names if n.split("/")[0] in (".git", ".venv", "outputs", ".pytest_cache")
           or "__pycache__" in n or ".egg-info/" in n]
    assert not bad, bad[:10]
    assert pkg.stat().st_size < 64 * 2**20  # Ray's hard limit is 512 MiB, warning from 256 MiB


@pytest.mark.e2e   # a `git ls-files` process
def test_runtime_env_upload_carries_every_bundled_file_a_default_run_reads(tmp_path):
    """The default `peer-rl train` inside a job reads the uploaded copy of peer_rl/bundled/ (the
    working dir comes first on PYTHONPATH): the shipped tiny models' weights must travel with
    it (and the SmolLM2 adapters `peer-rl chain smollm2` merges), while weights anywhere else in
    the tree (a user's checkpoints) stay out."""
    from ray._private.runtime_env.packaging import create_package

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    needed = [n for n in tracked if n.startswith(("peer_rl/bundled/", "recipes/"))]
    weights = [n for n in needed if n.endswith(".safetensors")]
    assert sorted(weights) == ["peer_rl/bundled/models/smollm2/judge/adapter_model.safetensors",
                               "peer_rl/bundled/models/smollm2/policy/adapter_model.safetensors",
                               "peer_rl/bundled/models/tiny/judge/model.safetensors",
                               "peer_rl/bundled/models/tiny/policy/model.safetensors"], weights
    tree = tmp_path / "repo"                 # the checkout, plus a user's checkpoint in it
    for name in tracked:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tree / name)
    (tree / "ckpt" / "sft").mkdir(parents=True)
    (tree / "ckpt" / "sft" / "model.safetensors").write_bytes(b"\0" * 16)
    pkg = tmp_path / "pkg.zip"
    create_package(str(tree), pkg, include_gitignore=True,
                   excludes=_load("runtime_env.yaml")["excludes"])
    names = set(zipfile.ZipFile(pkg).namelist())
    missing = sorted(set(needed) - names)
    assert not missing, missing[:10]
    assert "ckpt/sft/model.safetensors" not in names


def test_launcher_config_validates_against_ray_schema():
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = _load("ray-cluster.yaml")
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(cfg, schema)
    validate_config(cfg)  # the schema plus the launcher's own cross-field checks
    validate_config(prepare_config(copy.deepcopy(cfg)))  # after provider defaults are merged
    for key in schema["required"] + ["head_node_type", "available_node_types",
                                     "setup_commands", "head_start_ray_commands",
                                     "worker_start_ray_commands"]:
        assert key in cfg, key
    with pytest.raises(jsonschema.ValidationError):  # the schema does reject what it should
        validate_config({**cfg, "head_start_commands": []})

    head = " ".join(cfg["head_start_ray_commands"])
    assert "--head" in head and "--dashboard-host=127.0.0.1" in head
    assert any("peer-rl[gpu]" in c and "-e" in c.split() for c in cfg["setup_commands"])
    types = cfg["available_node_types"]
    gpus = sum(t["resources"].get("GPU", 0) * (1 if n == cfg["head_node_type"] else
                                                t.get("min_workers", 0)) for n, t in types.items())
    cpus = sum(t["resources"].get("CPU", 0) * (1 if n == cfg["head_node_type"] else
                                                t.get("min_workers", 0)) for n, t in types.items())
    need = _demand(load_config(["recipe=peer_rur"]))
    assert gpus >= need["GPU"] and cpus >= need["CPU"], (gpus, cpus, need)


def _quantity(v) -> float:
    return float(str(v).rstrip("m")) / (1000 if str(v).endswith("m") else 1)


def test_rayjob_manifest_has_the_fields_kuberay_requires():
    from ray.runtime_env import RuntimeEnv

    job = _load("rayjob.yaml")
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", job["metadata"]["name"])
    spec = job["spec"]
    argv = shlex.split(spec["entrypoint"])
    assert argv[:3] == ["peer-rl", "train", "recipe=peer_rur"], argv
    cfg = load_config(argv[2:])  # every override names a key of the schema
    assert cfg.recipe == "peer_rur"
    env = yaml.safe_load(spec["runtimeEnvYAML"])
    RuntimeEnv(**env)
    assert "PYTHONPATH" not in env.get("env_vars", {})
    assert spec["shutdownAfterJobFinishes"] is True

    rcs = spec["rayClusterSpec"]
    assert rcs["rayVersion"] == ray.__version__
    assert rcs["authOptions"]["mode"] == "token"
    head = rcs["headGroupSpec"]  # CRD: headGroupSpec requires template
    assert head["template"]["spec"]["containers"][0]["image"]
    assert isinstance(head.get("rayStartParams", {}), dict)
    gpus = 0.0
    for group in rcs["workerGroupSpecs"]:  # CRD: groupName, minReplicas, maxReplicas, template
        for key in ("groupName", "minReplicas", "maxReplicas", "template"):
            assert key in group, key
        assert group["minReplicas"] <= group.get("replicas", group["minReplicas"]) \
            <= group["maxReplicas"]
        containers = group["template"]["spec"]["containers"]
        assert containers and all(c.get("name") and c.get("image") for c in containers)
        limits = containers[0]["resources"]["limits"]
        gpus += _quantity(limits.get("nvidia.com/gpu", 0)) * group["minReplicas"]
    assert gpus >= _demand(cfg)["GPU"], (gpus, _demand(cfg))


@pytest.mark.e2e   # a `bash -n` process
def test_local_cluster_script_is_valid_bash():
    script = CLUSTER / "start-local-cluster.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "--dashboard-host=127.0.0.1" in text and "--node-ip-address" in text
    assert not re.search(r"^[^#]*\bray stop\b", text, re.M)  # would stop other people's clusters


# ------------------------------------------------------------------ e2e: a real 2-node cluster

def docs_submit_command(dashboard: str) -> list[str]:
    """The `ray job submit` command of docs/cluster.md's two-nodes-on-one-machine block, as a
    user copies it, pointed at `dashboard` (the test's free port instead of 8265)."""
    text = (REPO / "docs" / "cluster.md").read_text(encoding="utf-8")
    block = re.search(r"^ {4}bash cluster/start-local-cluster.sh start.*?\n((?: {4,}.*\n)+?)"
                      r" {4}bash cluster/start-local-cluster.sh stop", text, re.M)
    assert block, "docs/cluster.md: the local two-node block is gone"
    argv = shlex.split(block.group(1).replace("\\\n", " "))
    while "=" in argv[0]:                    # VAR=value prefixes: the test's env sets them
        argv.pop(0)
    assert Path(argv[0]).name == "ray" and argv[1:3] == ["job", "submit"], argv
    i = argv.index("--address")
    assert argv[i + 1] == "http://127.0.0.1:8265", argv
    return [*argv[1:i + 1], dashboard, *argv[i + 2:]]


def test_the_docs_submit_command_is_the_default_run():
    """No model paths, no recipe: what the docs give a new user is the default run."""
    argv = docs_submit_command("http://127.0.0.1:1")
    train = argv[argv.index("--") + 1:]
    assert train == ["python", "-m", "peer_rl.cli", "train", "trainer.total_steps=1"], train
    assert argv[argv.index("--runtime-env") + 1] == "cluster/runtime_env.yaml"


@pytest.mark.e2e
def test_ray_job_submit_runs_the_docs_command_on_two_local_nodes(local_cluster):
    """docs/cluster.md's command as written: the default recipe with the tiny models peer-rl
    ships, which must reach the job through the uploaded working dir."""
    cluster = local_cluster
    nodes = [n for n in cluster.nodes() if n["state"] == "ALIVE"]
    assert sorted(n["node_ip"] for n in nodes) == [HEAD_IP, WORKER_IP], nodes
    assert sum(n["resources_total"].get("CPU", 0) for n in nodes) == 2
    assert any("node2" in n["resources_total"] for n in nodes)
    need = _demand(load_config([]))
    assert 1 < need["CPU"] <= 2, need  # more than one node holds: the pools must span both

    argv = docs_submit_command(cluster.dashboard)
    sid = f"peer-rl-e2e-{uuid.uuid4().hex[:8]}"
    i = argv.index("--")
    args = (*argv[:i], "--submission-id", sid, *argv[i:])
    for _ in range(3):
        submit = cluster.cli(*args, timeout=900, check=False)
        # Ray's job server answers this (and creates no job) while the head's dashboard agent
        # is still registering - seconds after start on a loaded machine; its advice is to retry
        if "try again later" not in submit.stdout + submit.stderr:
            break
        time.sleep(5)
    status = next((j["status"] for j in cluster.jobs() if j.get("submission_id") == sid), None)
    logs = cluster.cli("job", "logs", "--address", cluster.dashboard, sid, check=False).stdout
    assert status == "SUCCEEDED", (f"job status {status}\n--- ray job submit\n"
                                   + submit.stdout[-3000:] + submit.stderr[-3000:]
                                   + "\n--- job logs\n" + logs[-6000:])
    assert submit.returncode == 0, submit.stderr[-3000:]
    assert "tiny judge and policy: the trained ones shipped with peer-rl" in logs, logs[-6000:]
    done = re.search(r"\[peer-rl\] done: 1 step\(s\); output in (\S+)", logs)
    assert done, logs[-6000:]
    out = Path(done.group(1))            # the default output_dir, in the job's working dir
    assert "working_dir_files" in str(out), out

    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1]
    assert (out / "checkpoints" / "step_1").is_dir()
    assert (out / "config.yaml").exists()
    # logging.log_samples is off by default: no dialogue text in the job's logs or its files
    cfg = load_config([])
    from peer_rl.trainer.run import load_prompts
    snippets = {t["content"][:40] for r in load_prompts(cfg) for t in r["history"]
                if len(t["content"]) >= 40}
    written = logs + submit.stdout + submit.stderr + "".join(
        f.read_text(errors="ignore") for f in out.rglob("*")
        if f.is_file() and f.suffix in (".jsonl", ".yaml", ".json", ".txt", ".log"))
    assert len(snippets) > 20, len(snippets)           # the check below has text to look for
    leaked = [x for x in snippets if x in written]
    assert not leaked, leaked[:3]
    assert not (out / "samples.jsonl").exists()

    # the worker actors really ran on both nodes
    actors = json.loads(cluster.cli("list", "actors", "--address", cluster.dashboard,
                                    "--format", "json", "--detail", "--limit", "1000").stdout)
    kinds = {"RolloutWorker", "UnifiRewardWorker", "RedundancyWorker", "PolicyWorker"}
    ours = [a for a in actors if a.get("class_name") in kinds]
    assert {a["class_name"] for a in ours} == kinds, [a.get("class_name") for a in actors]
    assert len({a["node_id"] for a in ours}) == 2, [(a["class_name"], a["node_id"]) for a in ours]
