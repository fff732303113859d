"""`peer-rl plan`: where a recipe's pools land on a cluster and what each GPU holds, before
anything is loaded or rented."""
from __future__ import annotations

from peer_rl.cli.errors import CommandError


def register(sub) -> None:
    p = sub.add_parser(
        "plan", help="place a recipe's pools on a cluster and estimate each GPU's memory",
        description="peer-rl plan [recipe=NAME] [key=value ...] [cluster=FILE | nodes=N "
                    "gpus_per_node=G gpu_memory_gib=M cpus_per_node=C]: the pools' bundles and "
                    "nodes, each worker's memory per GPU, and what does not fit with settings "
                    "that would. model.path / reward_model.path take a model directory or a "
                    "named shape (Qwen2.5-VL-7B, Qwen2.5-7B, Qwen2.5-VL-3B, SmolLM2-135M). "
                    "Exit 0 when it fits, 2 when refused.")
    p.add_argument("overrides", nargs="*", help="recipe keys and the cluster's")
    p.add_argument("--from-ray", default="", metavar="ADDRESS",
                   help="the nodes of a running Ray cluster (e.g. auto; gpu_memory_gib= says "
                        "its GPUs' memory, 80 by default)")
    p.add_argument("--probe", action="store_true",
                   help="with --from-ray: create the run's placement groups there and report "
                        "where Ray put every bundle (no model loaded, no CUDA touched)")
    p.add_argument("--probe-timeout", type=float, default=20.0, metavar="SECONDS",
                   help="with --probe: how long each pool's placement group may wait to be "
                        "placed before the pool is reported refused (default 20; an "
                        "autoscaling cluster may need longer)")
    p.add_argument("--table", action="store_true",
                   help="a Markdown sizing table instead: the recipe planned on 1, 2 and 4 "
                        "nodes (gpus_per_node=, 8 by default) of 80 and 141 GiB GPUs")
    p.set_defaults(fn=_plan, errors=_errors)


def _errors() -> dict:
    from peer_rl.config.schema import ConfigError  # deferred (--help)

    return {ConfigError: 2, ValueError: 2}


def _print_probe(cfg, plan, timeout_s: float) -> None:
    """Ray's own placement of the run, beside the plan's."""
    # deferred: pulls in numpy, ray, torch
    from peer_rl.planning.probe import in_use, node_map, probe

    held = in_use()
    found, refused = probe(cfg, timeout_s=timeout_s)
    print("\nprobe: where Ray placed each bundle")
    if held:
        print(f"  the cluster is in use ({', '.join(f'{v:g} {k}' for k, v in held.items())} "
              "held by other work after 30 s): Ray places around it, while the plan is of "
              "empty nodes")
    for p in found:
        gpus = f" GPU ids {','.join(p.gpu_ids)}" if p.gpu_ids else ""
        print(f"  {p.pool:13s} {p.index:3d}  node {p.node}{gpus}  CPU {p.cpus:g}")
    if refused:
        print(f"  refused by Ray: {refused}")
    gpu_pools = {pool for pool in plan.sizes if cfg.resources[pool].gpus_per_worker}
    same = node_map((p.pool, p.node) for p in found if p.pool in gpu_pools) == \
        node_map((s.pool, s.node) for s in plan.slots if s.pool in gpu_pools)
    print(f"probe {'matches' if same else 'DIFFERS FROM'} the plan's GPU bundles per node "
          "(a CPU-only worker may land on either of two equally free nodes)")


def _plan(args) -> int:
    from peer_rl.config.schema import load_config  # deferred (--help)
    from peer_rl.planning import cluster  # deferred (--help)
    # deferred: pulls in numpy, omegaconf, torch, yaml
    from peer_rl.planning.plan import fitting_fixes, make_plan
    from peer_rl.planning.report import render  # deferred: pulls in numpy, omegaconf, torch, yaml

    keys = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in args.overrides if "=" in o}
    mine = {k: v for k, v in keys.items() if k in cluster.KEYS or k == "cluster"}
    overrides = [o for o in args.overrides if o.split("=", 1)[0] not in mine]
    if args.probe and not args.from_ray:
        raise CommandError("--probe places the run on a running cluster: give --from-ray ADDRESS")
    if not args.probe_timeout > 0:
        raise CommandError(f"--probe-timeout={args.probe_timeout:g}: expected seconds > 0")
    if args.table:
        # deferred: pulls in numpy, omegaconf, torch, yaml
        from peer_rl.planning.report import sizing_table

        node = cluster.from_overrides({k: v for k, v in mine.items()
                                       if k in ("gpus_per_node", "cpus_per_node")})[0]
        print(sizing_table(overrides, node.gpus, node.cpus))
        return 0
    cfg = load_config(overrides)
    if args.from_ray:
        import ray  # deferred: ray (~1 s); commands that start no cluster run without it

        ray.init(address=args.from_ray, logging_level="ERROR")
        try:
            nodes = cluster.from_ray(float(mine.get("gpu_memory_gib", 80)))
            plan = make_plan(cfg, nodes)
            print(render(plan, cfg.recipe, cfg))
            if args.probe:
                _print_probe(cfg, plan, args.probe_timeout)
        finally:
            ray.shutdown()
    else:
        nodes = (cluster.from_file(mine.pop("cluster")) if "cluster" in mine
                 else cluster.from_overrides(mine))
        plan = make_plan(cfg, nodes)
        print(render(plan, cfg.recipe, cfg))
    if plan.fits:
        print("\nfits.")
        return 0
    print("\nrefused:")
    for p in plan.problems:
        print(f"  {p}")
    fixes = fitting_fixes(overrides, nodes, plan)
    if fixes:
        print("settings with which it fits (each planned again):")
        for f in fixes:
            print("  " + " ".join(f))
    else:
        print("none of the changes tried makes it fit: add GPUs or nodes (more policy ranks "
              "share the policy's state), or a smaller model")
    return 2
