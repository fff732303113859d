"""`peer-rl train`: resolve the config, load prompts, start Ray and the pools, run the controller."""
from __future__ import annotations

import logging
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from peer_rl.config.reward_kinds import reward_kind
from peer_rl.config.schema import ConfigError, load_config, public_config, save_config
from peer_rl.config.worker_settings import LoRASettings, narrow
from peer_rl.data.history import training_rows
from peer_rl.data.prompt_loader import PromptPoolError, restore_prompts, select_prompts
from peer_rl.files.out_paths import claim_run_dir, new_dir, read_json
from peer_rl.models.local import check_adapter_dir, check_model_dir
from peer_rl.models.pinned import card_files, check_languages
from peer_rl.prompts.judge import JudgeTemplate, TEMPLATE_FILE, TemplateError
from peer_rl.prompts.multimodal import is_vision_language
from peer_rl.prompts.policy import PolicyTemplate, training_template
from peer_rl.retrieval.corpus import index_from_root
from peer_rl.supervised.tiny_models import default_cache_dir
from peer_rl.tracking.metrics import LOGS
from peer_rl.tracking.trackers import check_mlflow_store, open_trackers
from peer_rl.trainer import tiny_cache
from peer_rl.trainer.checkpoints import (STATE_FILE, complete_checkpoints, latest_checkpoint,
                                         not_shared_error, resume_checkpoint,
                                         saved_prompt_selection)
from peer_rl.trainer.cluster_watch import (ClusterLost, ClusterWatch, effective_lost_after,
                                            lost_message, reachable)
from peer_rl.trainer.preemption import RunStopped, StopRequest
from peer_rl.trainer.profile_rows import profile_rows
from peer_rl.trainer.prompt_lengths import check_prompt_room, load_processors, prompt_lengths
from peer_rl.trainer.runtime import init_ray, quiet_driver

log = logging.getLogger(__name__)


def resolve_models(cfg) -> tuple[str, str]:
    """Policy and judge paths. Empty paths mean the tiny models after their tiny supervised
    stages, built offline once and cached: for PEER a judge that answers in the verdict format
    and a policy that writes Steps 1-4 (peer_rl.trainer.tiny_cache.ensure_trained_tiny_models); for
    a reward kind of the escrag style (reward_model.kind=scalar, ESCRAG-R1) the Bradley-Terry
    reward model and the policy after the `<think>` cold start."""
    policy, judge = cfg.model.path, cfg.reward_model.path
    if not policy or not judge:
        cache, address = cfg.model.tiny_cache_dir or default_cache_dir(), cfg.ray.address
        if reward_kind(cfg.reward_model.kind).style == "escrag":
            judge = judge or tiny_cache.ensure_trained_tiny_reward_model(cache, address)
            policy = policy or tiny_cache.ensure_trained_tiny_escrag_policy(cache, address)
        else:
            tiny = tiny_cache.ensure_trained_tiny_models(cache, address)
            policy, judge = policy or tiny["policy"], judge or tiny["judge"]

    for key, path in (("model.path", policy), ("reward_model.path", judge)):
        check_model_dir(f"{key}={path!r}", path)
    return str(policy), str(judge)


def check_judges(cfg, judge: str) -> None:
    """The generative judges' templates read, and each judge sits in the slot its template's
    role names (a PRM given as UnifiReward would never be asked the preference round), before
    any pool starts."""
    kind = reward_kind(cfg.reward_model.kind)
    if not kind.writes:                  # a scoring model: no template to read
        return
    paths = (judge, *(cfg.reward_model[key] for key in kind.models[1:]))
    slots = [(f"reward_model.{key}", path, role)
             for key, path, role in zip(kind.models, paths, kind.judge_roles)]

    lora = cfg.reward_model.lora_path
    if lora:      # the judge is the base plus this adapter, and its template is the adapter's
        check_adapter_dir(f"reward_model.lora_path={lora!r}", lora, also=(TEMPLATE_FILE,))
    for key, path, role in slots:
        check_model_dir(f"{key}={path!r}", path)
        if lora:
            key, path = "reward_model.lora_path", lora
        try:
            found = JudgeTemplate.load(path).role
        except TemplateError as exc:
            raise ConfigError(f"{key}: {exc}") from None
        if found != role:
            raise ConfigError(f"{key}={path!r}: its judge_template.json has role {found!r}; "
                              f"reward_model.kind={kind.name} needs a {role} judge here")


def resolve_index(cfg, out: Path) -> str:
    """retrieval.index, or an index built from data.root's exemplars/ (else preference/) of
    retrieval.splits into <output_dir>/index, rebuilt only when the source files or the
    embedding model change."""
    from peer_rl.data.bundled import sample_root  # deferred: pulls in PIL

    if cfg.retrieval.index:
        return cfg.retrieval.index
    root = Path(cfg.data.root) if cfg.data.root else sample_root()
    return str(index_from_root(root, out / "index", cfg.retrieval.embedding_model,
                               tuple(cfg.retrieval.splits), cfg.data.skip_invalid,
                               log=lambda m: print(m, flush=True)))


def load_prompts(cfg, selection: list[str] | None = None) -> list[dict]:
    """Validated grpo rows of data.train_files (invalid rows fail, or are counted and skipped),
    drawn per data.prompts_per_file; `selection` (prompt ids saved with a checkpoint) restores
    the pool of the run being resumed instead of drawing a new one."""
    from peer_rl.data.loading import load_subset  # deferred: pulls in datasets
    from peer_rl.data.bundled import sample_root  # deferred: pulls in PIL

    root = Path(cfg.data.root) if cfg.data.root else sample_root()
    files: list[list[dict]] = []
    from peer_rl.data.loading import check_in_root  # deferred: pulls in datasets

    for rel in cfg.data.train_files:
        check_in_root(root, rel, "data.train_files")
        if not (root / rel).exists():
            raise FileNotFoundError(f"data.train_files: {root / rel} does not exist")
        subset, name = Path(rel).parts[0], Path(rel).name
        res = load_subset(root, subset, name, skip_invalid=cfg.data.skip_invalid,
                          languages=cfg.data.languages)
        if res.filtered:
            log.warning(f"{rel}: data.languages={list(cfg.data.languages)}: left out "
                        f"{res.n_filtered} row(s) ({res.filtered})")
        if res.n_skipped:
            reasons = Counter()
            for rep in res.reports:
                reasons.update(rep.reasons())
            log.warning(f"{rel}: skipped {res.n_skipped} invalid row(s): {dict(reasons)}")
        # the one place a row's history is decided (peer_rl.data.history): the policy's
        # prompt, the judge, RUR, ESCRAG-R1's passes and the retrieval all read it
        files.append(training_rows(list(res.dataset), cfg.data.max_history_turns))
    seen: dict[str, str] = {}
    for rel, f in zip(cfg.data.train_files, files):
        for r in f:
            if seen.setdefault(r["id"], rel) != rel:
                raise PromptPoolError(f"data.train_files: prompt id {r['id']!r} is in both "
                                 f"{seen[r['id']]} and {rel}; ids must be unique across the files "
                                 "of a run (checkpoints record the prompt pool by id)")
    if selection is not None:
        rows = restore_prompts([r for f in files for r in f], selection, "resume")
        how = "restored from the checkpoint"
    else:
        rows = select_prompts(files, list(cfg.data.prompts_per_file), cfg.data.seed)
        how = "drawn with data.seed" if any(cfg.data.prompts_per_file) else "all rows"
    per_modality = Counter(r["modality"] for r in rows)
    log.info(f"{len(rows)} training prompt(s) from {root} ({how}; "
             f"{', '.join(f'{k} {v}' for k, v in sorted(per_modality.items()))})")
    return rows


def check_modalities(cfg, rows: list[dict], policy: str) -> None:
    """Visual rows need a vision-language policy: the update must see the frames the rollout
    was conditioned on. A text-only policy trains them only when the recipe says so."""
    n_visual = sum(bool(r.get("images")) for r in rows)
    vision = is_vision_language(policy)
    if n_visual and not vision and not cfg.data.visual_rows_as_text:
        raise ConfigError(
            f"model.path={policy!r} is a text-only model but {n_visual} training prompt(s) have "
            "images (data.train_files includes visual rows). Use a vision-language checkpoint "
            "(Qwen2-VL / Qwen2.5-VL / Qwen3-VL), drop the visual files from data.train_files, or "
            "set data.visual_rows_as_text=true to train those rows on their words alone.")
    if n_visual and not vision:
        log.info(f"data.visual_rows_as_text: {n_visual} visual prompt(s) are trained on "
                 "their text (the policy is text-only)")


def check_policy_lora(cfg, policy: str) -> None:
    """model.lora against the policy's module tree (peer_rl.workers.lora.check_settings: built from its
    config.json on the meta device, no weight read), before Ray starts: a target that adapts
    nothing fails in seconds, naming the key, not in a policy rank once the pools are up."""
    if not cfg.model.lora.rank:
        return
    from peer_rl.workers.lora import check_settings  # deferred: pulls in torch

    try:
        check_settings(narrow(LoRASettings, cfg.model.lora), policy)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(str(exc)) from None


def check_fresh_output(cfg, out: Path) -> None:
    """resume=disable starts a new run: into a directory that holds another run's metrics,
    checkpoints or final policy it would replace some of them and leave the rest for a later
    resume=auto to mix in, so it is refused (as the supervised stages refuse).
    resume=<checkpoint> continues the run that wrote it only from its newest checkpoint (a
    directory holds one timeline: peer_rl.trainer.checkpoints); from an earlier one, or from
    another run's, it goes into a directory that holds no run yet."""
    held = [name for name in (*LOGS, "checkpoints", "final")
            if out.is_dir() and (out / name).exists()]
    if cfg.resume not in ("disable", "auto"):
        ckpt = Path(cfg.resume)
        if not (ckpt / STATE_FILE).exists():
            raise ConfigError(f"resume={cfg.resume}: not a complete checkpoint (no "
                              f"{STATE_FILE}); expected <output_dir>/checkpoints/step_N")
        if ckpt.resolve().parent != (out / "checkpoints").resolve():
            if held:
                raise ConfigError(
                    f"resume={cfg.resume}: a checkpoint of another run, and "
                    f"trainer.output_dir={out} holds a run of its own ({', '.join(held)}) that "
                    "resuming would cut back and write over; set trainer.output_dir to the "
                    "checkpoint's run or to a new directory")
            return
        step = read_json(ckpt / STATE_FILE, "checkpoint state").get("step", 0)
        later = [p.name for p in complete_checkpoints(out) if int(p.name.split("_")[1]) > step]
        if later:
            raise ConfigError(
                f"resume={cfg.resume}: the run went on past it ({', '.join(later[:3])}"
                f"{' ...' if len(later) > 3 else ''}), and resuming here would cut its metrics "
                "back and write over its later checkpoints; to branch from it, set "
                "trainer.output_dir to a new directory, or pass resume=auto to continue from "
                "the newest")
        return
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"trainer.output_dir={out}: exists and is not a directory")
    if cfg.resume == "auto" and latest_checkpoint(out) is not None:
        return
    # resume=auto without a complete checkpoint starts afresh, as resume=disable does: it
    # would replace the run's metrics and final policy, so the same refusal holds
    if held:
        why = "pass resume=auto to continue it" if cfg.resume == "disable" else \
            "it has no complete checkpoint to continue from: move it aside"
        raise ConfigError(f"resume={cfg.resume}: trainer.output_dir={out} already holds a run "
                          f"({', '.join(held)}); {why}, or choose another trainer.output_dir")


def check_shared_output(actor_handles: list, out: Path) -> None:
    """Each policy rank writes a probe file into the output directory, which the controller
    must see: a relative or node-local trainer.output_dir on a multi-node cluster would leave
    checkpoint shards on the GPU nodes and a complete-looking checkpoint on the head."""
    import ray  # deferred: ray (~1 s); commands that start no cluster run without it

    probe = new_dir(out, "shared-probe")     # made now, so removed after
    try:
        found = ray.get([h.write_probe.remote(str(probe)) for h in actor_handles])
        unseen = [f"rank {r['rank']} on {r['host']}: {Path(r['path']).name}" for r in found
                  if not Path(r["path"]).exists()]
        if unseen:
            raise not_shared_error("trainer.output_dir", out, unseen)
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def measured_prompts(cfg, rows: list[dict], policy: str) -> int:
    """The longest PEER prompt in the policy's tokens, each checked to leave room for its reply
    (peer_rl.trainer.prompt_lengths); 0 where the method builds the prompts (ESCRAG-R1: the
    reward kind's rows_prompt is false). Either way the policy's tokenizer and image processor
    are loaded here first, before any pool."""
    if not reward_kind(cfg.reward_model.kind).rows_prompt or cfg.dialogue.enable:
        load_processors(policy)
        return 0

    lengths = prompt_lengths(rows, policy)
    check_prompt_room(rows, lengths, cfg.rollout.max_model_len, cfg.rollout.response_length)
    return max(lengths, default=0)


def run(overrides: list[str]) -> Path:
    from peer_rl.data.bundled import SAMPLE_ROOT  # deferred: pulls in PIL

    cfg = load_config(overrides)
    if not cfg.logging.verbose:
        quiet_driver()
    out = Path(cfg.trainer.output_dir).resolve()
    check_fresh_output(cfg, out)
    # check_fresh_output has refused a run there to replace; locked while this run writes it
    inputs = [cfg.data.root or SAMPLE_ROOT, cfg.model.path, cfg.reward_model.path,
              cfg.reward_model.outcome_path, cfg.reward_model.lora_path,
              cfg.model.lora.lora_adapter_path]
    check_mlflow_store(cfg, out, inputs)        # a local store is an output too
    lock = claim_run_dir(out, "train", inputs)
    try:
        return _train(cfg, out)
    finally:
        lock.close()


def _train(cfg, out: Path) -> Path:
    """The run, in the output directory run() has claimed and locked."""
    from peer_rl.trainer.controller import Controller  # deferred: pulls in ray, torch
    from peer_rl.data.loading import row_language  # deferred: pulls in datasets
    from peer_rl.trainer.resource_pools import PoolFactory  # deferred: pulls in ray, torch
    from peer_rl.trainer.worker_group import PoolFailed  # deferred: pulls in ray

    save_config(cfg, out / "config.yaml")
    log.info(f"recipe={cfg.recipe} experiment={cfg.experiment_name} output_dir={out}")
    template = None
    if cfg.dialogue.enable:          # the policy answers the built-in prompt every turn
        rows, template = profile_rows(cfg), PolicyTemplate()
    else:
        rows = load_prompts(cfg, saved_prompt_selection(resume_checkpoint(cfg, out)))
    if reward_kind(cfg.reward_model.kind).rows_prompt and not cfg.dialogue.enable:
        template, line = training_template(rows)
        log.info(line)
    policy, judge = resolve_models(cfg)
    check_judges(cfg, judge)
    check_modalities(cfg, rows, policy)
    check_languages(Counter(row_language(r) for r in rows), policy, "model.path")
    check_policy_lora(cfg, policy)
    t0 = time.perf_counter()
    # the prompts' token lengths (seconds of imports) while the local cluster starts
    lengths = ThreadPoolExecutor(1).submit(measured_prompts, cfg, rows, policy)
    stop = StopRequest("the current step")   # from here on a SIGTERM ends the run cleanly
    with stop:
        init_ray(cfg)
        import ray  # deferred: ray (~1 s); commands that start no cluster run without it

        stop.install()                       # Ray's driver took SIGTERM over (it aborts)
        longest = lengths.result()
        index = resolve_index(cfg, out) if cfg.retrieval.enable else ""
        factory = PoolFactory(cfg, policy, judge, index, longest)
        log.info(f"{factory.dtype_line()}")
        kv_line = factory.kv_cache_line()
        if kv_line:
            log.info(kv_line)
        pools = plots = trackers = controller = None
        watch = ClusterWatch(ray.get_runtime_context().gcs_address,
                             effective_lost_after(cfg.ray.lost_after_s),
                             step=lambda: controller.step + 1 if controller else 0,
                             last_checkpoint=lambda: latest_checkpoint(out)).start()
        try:
            # W&B / MLflow runs before the pools: a bad tracking URI or key fails in seconds
            trackers = open_trackers(cfg, out, resume_checkpoint(cfg, out) is not None,
                                     public_config(cfg))
            pools = factory.make_pools()
            log.info(f"pools ready in {time.perf_counter() - t0:.0f} s: "
                     + ", ".join(f"{name} x{len(getattr(pools, name))} ({s:.0f} s)"
                                 for name, s in factory.ready_s.items()))
            check_shared_output(pools.actor, out)
            log.info(f"actor: {ray.get(pools.actor[0].recomputation.remote())['line']}")
            controller = Controller(cfg, pools, rows, out, policy_template=template,
                                    side_files=card_files(policy), trackers=trackers)
            trackers = None                  # the controller's metrics sink closes them
            # a lost cluster ends the run from the watch's thread: the trackers are closed
            watch.on_lost.append(lambda: controller.metrics.close(ok=False))
            steps = controller.fit(stop, plot=False)
            # the figures (~1 s of matplotlib) are drawn while the pools and Ray shut down
            plots = controller.plot_later()
        except PoolFailed as exc:            # a pool lost with the whole cluster: say that
            if reachable(watch.address, timeout=2.0):
                raise
            raise ClusterLost(lost_message(watch.address, 0, watch.step(),
                                           latest_checkpoint(out))) from exc
        finally:
            if trackers is not None:         # the pools never got to a controller
                trackers.close(ok=False)
            factory.shutdown(pools)
            watch.stop()                     # from here on Ray is shut down on purpose
            ray.shutdown()  # flush actor logs now, before the summary lines below
    if plots is not None:
        plots.result()
    if stop.signal:
        saved = out / "checkpoints" / f"step_{steps}"
        raise RunStopped(f"stopped by {stop.signal} after step {steps} of "
                         f"{cfg.trainer.total_steps}"
                         + (f"; checkpoint {saved}" if (saved / STATE_FILE).exists() else "")
                         + "; rerun with resume=auto to continue")
    final = out / "final"
    log.info(f"done: {steps} step(s); output in {out}"
             + (f" (policy, HF format: {final})" if (final / "config.json").exists() else ""))
    return out
