"""`peer-rl plan`: where a recipe's pools land on a cluster and what each GPU holds, before
anything is loaded or rented."""
from __future__ import annotations

import contextlib

from peer_rl.cli.errors import CommandError

# recipes that hold a command's settings, not a run to place: (schema, what they are for)
SETTINGS_RECIPES = {
    "peer_rl.datajobs.config:DataJobConfig":
        "the settings of `peer-rl data filter|personas|rewrite|preference|cold-start` (the "
        "model servers or local models those commands call)",
    "peer_rl.evaluation.config:EvalConfig":
        "the settings of `peer-rl eval esc|sage|safety|diversity` (the model under test, the "
        "simulated seeker and the judge)",
}


def register(sub) -> None:
    p = sub.add_parser(
        "plan", help="place a recipe's pools on a cluster and estimate each GPU's memory",
        description="peer-rl plan [recipe=NAME] [key=value ...] [cluster=FILE | nodes=N "
                    "gpus_per_node=G gpu_memory_gib=M cpus_per_node=C]: the pools' bundles and "
                    "nodes, each worker's memory per GPU, a step's tokens, and what does not fit "
                    "with settings that would. A GRPO recipe (`peer-rl train`) or a supervised "
                    "stage's (`peer-rl sft`, `peer-rl train-rm`: its Ray Train workers). "
                    "model.path / reward_model.path take a model directory or a named shape "
                    "(Qwen3-VL-8B, Qwen2.5-VL-7B, Qwen2.5-7B, Qwen2.5-VL-3B, SmolLM2-135M). "
                    "Exit 0 when it fits (or the recipe holds a command's settings, not a run: "
                    "one line says which), 2 when refused.")
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
    p.add_argument("--prompt-length", type=int, default=0, metavar="TOKENS",
                   help="GRPO: your prompts' length in the policy's tokens, for the tokens per "
                        "step (default: the longest a run admits, rollout.max_model_len - "
                        "rollout.response_length)")
    p.add_argument("--throughput", default="", metavar="rollout=TOK/S,update=TOK/S",
                   help="print an estimated step time at these tokens per second: rollout = "
                        "generated tokens/s of all engines together (a run's "
                        "rollout/tokens_per_s, `peer-rl bench step`), update = the update's "
                        "tokens/s, every pass as plan counts them, all ranks together; a "
                        "supervised stage takes update= alone")
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


@contextlib.contextmanager
def _nodes(args, mine: dict):
    """The cluster to plan for: a running Ray cluster's nodes (connected for the block, which
    --probe needs), a cluster file, or the nodes= ... overrides."""
    from peer_rl.planning import cluster  # deferred (--help)

    if not args.from_ray:
        yield (cluster.from_file(mine.pop("cluster")) if "cluster" in mine
               else cluster.from_overrides(mine))
        return
    import ray  # deferred: ray (~1 s); commands that start no cluster run without it

    ray.init(address=args.from_ray, logging_level="ERROR")
    try:
        yield cluster.from_ray(float(mine.get("gpu_memory_gib", 80)))
    finally:
        ray.shutdown()


def _settings_recipe(overrides: list[str]) -> str | None:
    """The line saying what a recipe of a command's settings (data.yaml, eval.yaml and copies)
    is for, or None when no such schema loads it."""
    import importlib

    from peer_rl.config.schema import ConfigError, load_config  # deferred (--help)

    recipe = next((o.split("=", 1)[1] for o in overrides if o.startswith("recipe=")), "tiny")
    for where, use in SETTINGS_RECIPES.items():
        module, name = where.split(":")
        try:
            load_config([f"recipe={recipe}"], check=lambda c: None,
                        schema=getattr(importlib.import_module(module), name))
        except ConfigError:
            continue
        return (f"recipe={recipe}: {use}, not a training run: nothing to place or size. Plan a "
                "GRPO recipe (recipe=peer_rur) or a supervised stage's (recipe=sft, "
                "recipe=unifireward)")
    return None


def _refused(problems: list[str], fixes: list[list[str]]) -> int:
    print("\nrefused:")
    for p in problems:
        print(f"  {p}")
    if fixes:
        print("settings with which it fits (each planned again):")
        for f in fixes:
            print("  " + " ".join(f))
    else:
        print("none of the changes tried makes it fit: add GPUs or nodes (more policy ranks "
              "share the policy's state), or a smaller model")
    return 2


def _plan_supervised(args, overrides: list[str], mine: dict) -> int:
    """A supervised stage's recipe: its Ray Train workers, each rank's memory, its tokens."""
    # deferred: pulls in omegaconf, yaml
    from peer_rl.planning import supervised
    from peer_rl.planning.report import render  # deferred: pulls in omegaconf, yaml
    from peer_rl.planning.tokens import parse_throughput, render_update_time

    if args.table or args.probe:
        raise CommandError(f"--{'table' if args.table else 'probe'} plans a GRPO recipe; a "
                           "supervised stage's is planned without it")
    throughput = parse_throughput(args.throughput, ("update",)) if args.throughput else None
    cfg = supervised.load(overrides)
    with _nodes(args, mine) as nodes:
        plan = supervised.make_supervised_plan(cfg, nodes)
    print(render(plan, cfg.recipe, note=f"a supervised stage (kind: {cfg.kind}) that `peer-rl "
                 f"{supervised.command(cfg.kind)}` runs on trainer.world_size Ray Train "
                 "workers, each an FSDP2 rank"))
    print("\n" + supervised.tokens_line(cfg))
    if throughput:
        print("\n".join(render_update_time(supervised.step_tokens(cfg), throughput["update"],
                                           cfg.trainer.total_steps)))
    if plan.fits:
        print("\nfits.")
        return 0
    return _refused(plan.problems, supervised.fitting_fixes(overrides, nodes))


def _print_grpo(cfg, plan, args, throughput) -> None:
    """The plan, then the step's tokens and, given a throughput, its estimated time."""
    from peer_rl.planning.report import render  # deferred: pulls in omegaconf, yaml
    from peer_rl.planning.tokens import render_step_time, render_tokens, step_tokens

    print(render(plan, cfg.recipe, cfg))
    tokens = step_tokens(cfg, args.prompt_length)
    print("\n" + "\n".join(render_tokens(tokens, bool(args.prompt_length),
                                           bool(cfg.dialogue.enable))))
    if throughput:
        print("\n".join(render_step_time(tokens, throughput, cfg.trainer.total_steps)))


def _plan(args) -> int:
    # deferred (--help)
    from peer_rl.config.schema import ConfigError, load_config, supervised_kind
    from peer_rl.planning import cluster  # deferred (--help)
    # deferred: pulls in numpy, omegaconf, torch, yaml
    from peer_rl.planning.plan import fitting_fixes, make_plan
    from peer_rl.planning.tokens import parse_throughput

    keys = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in args.overrides if "=" in o}
    mine = {k: v for k, v in keys.items() if k in cluster.KEYS or k == "cluster"}
    overrides = [o for o in args.overrides if o.split("=", 1)[0] not in mine]
    if args.probe and not args.from_ray:
        raise CommandError("--probe places the run on a running cluster: give --from-ray ADDRESS")
    if not args.probe_timeout > 0:
        raise CommandError(f"--probe-timeout={args.probe_timeout:g}: expected seconds > 0")
    if args.prompt_length < 0:
        raise CommandError(f"--prompt-length={args.prompt_length}: expected tokens >= 0")
    recipe = keys.get("recipe", "tiny")
    if supervised_kind(recipe) is not None:
        return _plan_supervised(args, overrides, mine)
    throughput = parse_throughput(args.throughput) if args.throughput else None
    if args.table:
        # deferred: pulls in numpy, omegaconf, torch, yaml
        from peer_rl.planning.report import sizing_table

        node = cluster.from_overrides({k: v for k, v in mine.items()
                                       if k in ("gpus_per_node", "cpus_per_node")})[0]
        print(sizing_table(overrides, node.gpus, node.cpus))
        return 0
    try:
        cfg = load_config(overrides)
    except ConfigError:
        line = _settings_recipe(overrides)
        if line is None:
            raise
        print(line)
        return 0
    with _nodes(args, mine) as nodes:
        plan = make_plan(cfg, nodes)
        _print_grpo(cfg, plan, args, throughput)
        if args.probe:
            _print_probe(cfg, plan, args.probe_timeout)
    if plan.fits:
        print("\nfits.")
        return 0
    return _refused(plan.problems, fitting_fixes(overrides, nodes, plan))
