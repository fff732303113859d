"""The single controller: one GRPO step is eight stages (prompts, rollout, parse, reward, RUR,
advantages, policy update, weight sync), in that order in `train_step`.

The controller holds no model. It talks to the pools only through their worker groups
(peer_rl.trainer.worker_group: fan-out, gather, restart) over the handles it is given (peer_rl.trainer.resource_pools)
and does the cheap, pure work itself (advantages, metrics). Stages 2-5 are the method's
(peer_rl.methods: PEER with UnifiReward, ESCRAG-R1 with a scalar reward), called as
`method.score(rows, step, timing)`; the method sees the worker groups, never the controller.
docs/architecture.md describes the stages, the pools and the reasons behind them.

With trainer.async_training.staleness=1 the stages 2-5 of step t+1 (rollout, judging,
redundancy: only the engine pools) run in a second thread while step t's update runs on the
policy ranks; the weights are synced once both are done, so every sample is exactly one update
old (the first step's: none). Each engine stamps its samples with the policy version it holds and
the policy refuses a batch outside the bound. The clipped ratio is taken around log-probs the
policy recomputes before its update (the proximal policy of decoupled PPO, AReaL), not around the
sampler's: the trust region then bounds this update exactly as in the synchronous loop, and the
one-version gap to the sampler is corrected by the capped importance weight
pi_old / pi_behavior per token (actor.behavior_weight_cap) from the engine's log-probs.
"""
from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray

from peer_rl.algos import sequence_advantages
from peer_rl.evaluation.in_training import InTrainingEval
from peer_rl.log import progress_bar
from peer_rl.files.out_paths import open_append, read_json, staged_dir, write_atomic
from peer_rl.trainer.checkpoints import (PROMPTS_FILE, STATE_FILE, latest_checkpoint, not_shared_error,
                                 prune_checkpoints, resume_checkpoint, unseen_files)
from peer_rl.files.durable import fsync_tree
from peer_rl.data.prompt_loader import Cursor, PromptLoader
from peer_rl.trainer.dynamic_sampling import refill, zero_variance_metrics
from peer_rl.methods import Groups, method_class
from peer_rl.tracking.metrics import MetricsSink, distinct_n, summarise
from peer_rl.config.schema import public_config
from peer_rl.tracking.trackers import open_trackers
from peer_rl.methods.scored_batch import ScoredBatch
from peer_rl.trainer.preemption import StopRequest
from peer_rl.trainer.step_batch import update_batch
from peer_rl.trainer.sync_group import WeightSyncGroup
from peer_rl.trainer.figures import TIMELINE_FILE, draw_figures
from peer_rl.trainer.timeline import Timing, append_spans, covered, overlap
from peer_rl.trainer.worker_group import (GroupHooks, PolicyGroup, Pools, WorkerGroup,
                                          WorkerRestarted)

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class ScoredStep:
    """A step's prompts with its stages 2-5 done: what the look-ahead (trainer.async_training)
    scores during one update and hands to the next train_step."""
    rows: list[dict]
    scored: ScoredBatch
    timing: Timing


class RunHooks(GroupHooks):
    """The controller's answers to every worker group: the step in progress (1-based), the
    run's newest complete checkpoint, a worker past its restarts replaced by the placement
    layer."""

    def __init__(self, controller: "Controller"):
        self.controller = controller

    def step(self) -> int:
        return self.controller.step + 1

    def last_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.controller.out)

    def replace(self, pool: str, i: int):
        restart = self.controller.pools.restart
        return restart(pool, i) if restart is not None else None


class RolloutHooks(RunHooks):
    """The engines hold the policy's weights: a restarted one is re-synced, and samples from
    weights other than the synced ones are refused (the engine restarted while idle)."""

    def on_restart(self, i: int) -> None:
        self.controller._resync_restarted(i)

    def check(self, i: int, method: str, result) -> None:
        self.controller._check_engine_weights(i, method, result)


class RetrievalHooks(RunHooks):
    """A retrieval worker names its process in every answer, so a restart while idle counts."""

    def identity(self, result):
        return result.pids[0]


class Controller:
    def __init__(self, cfg, pools: Pools, rows: list[dict], output_dir: Path,
                 policy_template=None, side_files: dict[str, str] | None = None,
                 trackers=None):
        """`trackers`: the run's W&B / MLflow runs when the caller opened them (run.py does,
        before the pools start, so a bad tracking URI fails in seconds); else opened here."""
        self.cfg, self.pools, self.out = cfg, pools, Path(output_dir)
        # peer_rl.prompts.policy.PolicyTemplate: written beside every exported policy, so an
        # evaluation asks it the way it was trained (None: the method builds its own prompts)
        self.policy_template = policy_template
        # name -> text written beside every exported policy (the start model's card)
        self.side_files = dict(side_files or {})
        self.step = 0
        self.staleness = cfg.trainer.async_training.staleness
        self.figures = ThreadPoolExecutor(1, thread_name_prefix="peer-rl-figures")
        t = cfg.trainer
        hooks = RunHooks(self)
        self.policy = PolicyGroup(pools.actor, pools.classes["actor"], hooks.last_checkpoint,
                                  hooks.step)

        def group(name: str, hooks: GroupHooks = hooks) -> WorkerGroup:
            return WorkerGroup(name, getattr(pools, name), t.max_actor_restarts,
                               t.recovery_timeout_s, hooks, cls=pools.classes.get(name))
        self.rollout = group("rollout", RolloutHooks(self))
        self.reward_model, self.redundancy = group("reward_model"), group("redundancy")
        self.retrieval = group("retrieval", RetrievalHooks(self))
        self.seeker = group("seeker")
        method = method_class(cfg)
        needs = method.pools(cfg)
        self.method = method.from_config(Groups(**{
            name: getattr(self, name) if name in needs else None
            for name in ("rollout", "reward_model", "redundancy", "retrieval", "seeker")}), cfg)
        self.G = self.method.settings.n    # rollout.n, as the method read it
        self.weight_sync = WeightSyncGroup(
            self.policy.call, lambda: self.rollout.handles, self.rollout.wait_alive,
            tensor_parallel_size=cfg.rollout.tensor_model_parallel_size,
            bucket_mb=cfg.actor.weight_sync_bucket_mb, max_retries=t.max_actor_restarts,
            timeout_s=cfg.actor.weight_sync_timeout_s)
        cursor = None
        resume_dir = resume_checkpoint(cfg, self.out)
        if resume_dir is not None:
            state = read_json(resume_dir / STATE_FILE, "checkpoint state")
            self.step, cursor = state["step"], Cursor(**state["cursor"])
        self.resume_cursor: dict | None = None   # the data cursor after self.step's draws
        self.loader = PromptLoader(rows, cfg.data.train_batch_size, cfg.data.seed,
                                   cfg.data.shuffle, cursor)
        self.metrics = MetricsSink(self.out, list(t.loggers),
                                   resume_step=self.step if resume_dir else None,
                                   trackers=trackers or open_trackers(
                                       cfg, self.out, resume_dir is not None,
                                       public_config(cfg)))
        self.stopped_by: str | None = None     # the signal that stopped fit() early
        self.evaluator = None
        if t.eval_freq:    # inputs are read now: a bad file fails before step 1

            self.evaluator = InTrainingEval(cfg, policy_template)
        if resume_dir is not None:
            log.info(f"resuming from {resume_dir} (step {self.step})")
            self.policy.call("load_checkpoint", str(resume_dir / "policy"))
        # versions count as the policy counts (its update count, restored with its checkpoint),
        # so the engines' stamps and the policy's staleness check agree
        self.policy_version = self.policy.call("health")[0]["global_step"]
        self.synced_version = self.policy_version   # what every engine's weights are now
        self.sync_bytes = 0                         # what the last weight sync sent
        # engines hold other weights than the policy: another version, or a policy that
        # started from a saved adapter (model.lora.lora_adapter_path) the engines lack
        if ({h["policy_version"] for h in self.rollout.health()} != {self.policy_version}
                or cfg.model.lora.rank and cfg.model.lora.lora_adapter_path):
            self._sync_weights()

    # ---------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        """Write a directory made beside step_N, then rename it to step_N: a crash never leaves
        a checkpoint that looks complete. The data cursor saved is the one after this step's
        batch: a batch already drawn and scored for the next step (trainer.async_training) is
        drawn and sampled again on resume. A step_N already there is never written over (a
        resume that would write over one is refused at start-up: trainer.run.check_fresh_output)."""
        step_dir = self.out / "checkpoints" / f"step_{self.step}"
        with staged_dir(step_dir, "refuse", refused="a checkpoint is never written over") as tmp:
            (tmp / "policy").mkdir()
            reports = self.policy.call("save_checkpoint", str(tmp / "policy"),
                                       self.cfg.trainer.save_hf_model)
            # every rank's shards must be where the controller (and a resume) reads them, and
            # on disk, before the state file marks the checkpoint complete
            unseen = unseen_files(tmp / "policy", [r for r in reports if r])
            if unseen:
                raise not_shared_error("trainer.output_dir", self.out, unseen)
            if (tmp / "policy" / "model").is_dir():
                self._write_side_files(tmp / "policy" / "model")
            cursor = self.resume_cursor or self.loader.cursor.state()
            state = {"step": self.step, "cursor": cursor,
                     "seed": self.cfg.trainer.seed, "experiment_name": self.cfg.experiment_name}
            (tmp / PROMPTS_FILE).write_text(
                json.dumps({"ids": [r["id"] for r in self.loader.rows]}), encoding="utf-8")
            fsync_tree(tmp)
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        prune_checkpoints(self.out, self.cfg.trainer.max_actor_ckpt_to_keep, upto=self.step)
        return step_dir

    def write_memory(self) -> dict:
        """memory.json: each pool's peak resident memory per worker (GiB) and the dtype its
        first worker computes in, from the workers' health probes; a worker that does not
        answer is left out and named."""
        pools = {"rollout": self.pools.rollout, "reward_model": self.pools.reward_model,
                 "actor": self.pools.actor, "redundancy": self.pools.redundancy,
                 "retrieval": self.pools.retrieval}
        out, dtypes, missing = {}, {}, []
        for name, handles in pools.items():
            peaks = []
            for i, h in enumerate(handles):
                try:
                    health = ray.get(h.health.remote(), timeout=60)
                except Exception:            # a dead or busy worker: the figure is unknown
                    missing.append(f"{name}[{i}]")
                    continue
                peaks.append(health["peak_rss_bytes"] / 2**30)
                if "dtype" in health:        # model pools (the encoders have no setting)
                    dtypes.setdefault(name, health["dtype"])
            if peaks:
                out[name] = [round(p, 2) for p in peaks]
        report = {"peak_rss_gib": out, "dtype": dtypes, "unanswered": missing,
                  "note": "per worker process; on CPU a vLLM engine runs inside its worker"}

        write_atomic(self.out / "memory.json", json.dumps(report, indent=1) + "\n")
        log.info("peak resident memory (GiB per worker): "
                 + "; ".join(f"{k} {v}" for k, v in out.items())
                 + (f"; no answer from {missing}" if missing else ""))
        return report

    def _write_side_files(self, directory: Path) -> None:
        if self.policy_template is not None:
            self.policy_template.save(directory)
        for name, text in self.side_files.items():
            (directory / name).write_text(text, encoding="utf-8")

    def export_final(self) -> Path:
        """<output_dir>/final: the trained policy as a plain Hugging Face model directory
        (what `peer-rl eval`, `peer-rl chat` and vLLM load), written beside and swapped in
        like `train-rm`'s final/ (peer_rl.files.out_paths.staged_dir)."""
        final = self.out / "final"
        with staged_dir(final) as tmp:
            self.policy.call("export_hf", str(tmp))
            self._write_side_files(tmp)
        return final

    # ---------------------------------------------------------------- engine weights
    def _sync_weights(self) -> None:
        """Policy -> engines over the weight-sync group (peer_rl.trainer.sync_group). A resync after an
        engine restart during an overlapped update stamps the version before that update, while
        the weights sent may already include it: the stamp can only overstate a sample's age."""
        sent = self.weight_sync.sync(version=self.policy_version)
        self.synced_version = self.policy_version
        self.sync_bytes = sent["bytes"]

    def _resync_restarted(self, i: int) -> None:
        """A restarted engine is a new process holding the initial checkpoint."""
        self.weight_sync.invalidate()
        self._sync_weights()

    def _check_engine_weights(self, i: int, method: str, samples) -> None:
        """An engine that died while idle is restarted by Ray before the next call reaches it,
        so the call succeeds on the initial checkpoint; its samples' stamp gives it away."""
        if method != "generate":
            return
        stale = {s.policy_version for s in samples} - {self.synced_version}
        if stale:
            raise WorkerRestarted(f"rollout worker {i} sampled with policy version "
                                  f"{sorted(stale)}, the engines were synced to "
                                  f"{self.synced_version}")

    @property
    def restarts(self) -> int:
        """Rollout, judge, redundancy and retrieval actors recovered (cumulative)."""
        groups = (self.rollout, self.reward_model, self.redundancy, self.retrieval)
        return sum(g.restarts for g in groups) + self.weight_sync.recoveries

    # ---------------------------------------------------------------- stages 2-5
    def _score_step(self, batch_rows: list[dict] | None, timing: Timing
                    ) -> tuple[list[dict], ScoredBatch]:
        """Stages 2-5 of one step: its prompts (`batch_rows`, else the loader's next batch)
        scored, and with algorithm.filter_groups the batch refilled with groups that carry a
        signal (peer_rl.trainer.dynamic_sampling). Every draw of a step happens here, before any draw
        of the next step: the data order is a function of the data alone, so a resumed run
        draws exactly what an uninterrupted one drew."""
        rows = self.loader.next_batch() if batch_rows is None else batch_rows
        scored = self.method.score(rows, timing.step, timing)
        if not self.cfg.algorithm.filter_groups.enable:
            scored.metrics |= zero_variance_metrics([scored])
            return rows, scored
        return self._refill(rows, scored, timing)

    def _refill(self, rows: list[dict], scored: ScoredBatch, timing: Timing
                ) -> tuple[list[dict], ScoredBatch]:
        """Dynamic sampling (peer_rl.trainer.dynamic_sampling.refill): more prompts drawn and
        scored, each draw's stage times added to this step's."""
        def draw() -> tuple[list[dict], ScoredBatch]:
            more_rows = self.loader.next_batch()
            more = Timing(timing.step)
            more_scored = self.method.score(more_rows, timing.step, more)
            timing.absorb(more)
            return more_rows, more_scored

        out_rows, out, note = refill((rows, scored), draw, self.cfg.algorithm.filter_groups,
                                     self.cfg.data.train_batch_size, timing.step)
        if note:
            log.warning(note)
        return out_rows, out

    def _scored_step(self, batch_rows: list[dict] | None, step: int) -> ScoredStep:
        """Stages 2-5 of step `step` (1-based), timed under that step."""
        timing = Timing(step)
        rows, scored = self._score_step(batch_rows, timing)
        return ScoredStep(rows, scored, timing)

    def _score_ahead(self, batch_rows: list[dict] | None = None) -> ScoredStep:
        """Stages 2-5 of the next step (run in a second thread while this step updates)."""
        return self._scored_step(batch_rows, self.step + 2)

    # ---------------------------------------------------------------- one step
    def train_step(self, batch_rows: list[dict] | None = None, ready: ScoredStep | None = None,
                   look_ahead: bool = False) -> tuple[dict, ScoredStep | None]:
        """One GRPO step. `ready`: its stages 2-5, when they already ran during the previous
        update; else its prompts are drawn (or `batch_rows`) and scored now. `look_ahead`: the
        next step's prompts are drawn and scored while this step updates
        (trainer.async_training). Returns (metrics, the next step scored ahead or None)."""
        cfg = self.cfg
        start = time.time()
        if ready is None:                                                # 2-5.
            ready = self._scored_step(batch_rows, self.step + 1)
        batch_rows, scored, timing = ready.rows, ready.scored, ready.timing
        # the data cursor after this step's draws and before the next step's: what a
        # checkpoint of this step saves
        self.resume_cursor = self.loader.cursor.state()
        samples = scored.samples

        adv = scored.advantages if scored.advantages is not None else sequence_advantages(
            cfg.algorithm.adv_estimator, scored.reweighted,               # 6. advantages
            np.array([s.uid for s in samples]), [len(s.response_ids) for s in samples],
            norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo)

        t = time.perf_counter()                                          # 7. policy update
        batch = update_batch(samples, adv, self.staleness, float(cfg.rollout.temperature))
        # one object in the store, read by every rank (passing the batch would serialise it
        # once per rank)
        refs = self.policy.submit("update", ray.put(batch))
        ahead = None
        if not look_ahead:
            actor_metrics = self.policy.collect(refs)[0]
            timing["update"] = time.perf_counter() - t
        else:
            with ThreadPoolExecutor(1, thread_name_prefix="score-ahead") as pool:
                future = pool.submit(self._score_ahead, None)
                actor_metrics = self.policy.collect(refs)[0]
                timing["update"] = time.perf_counter() - t
                ahead = future.result()
        self.policy_version += 1

        t = time.perf_counter()                                          # 8. weight sync
        self._sync_weights()
        timing["sync"] = time.perf_counter() - t

        m = self._step_metrics(batch_rows, scored, adv, actor_metrics, timing)
        # wall time of this call: with the overlap, this step's stages 2-5 ran in the previous
        # call and the next step's run inside this one (timing_s/overlap: inside the update)
        end = time.time()
        spans = timing.spans + (ahead.timing.spans if ahead else [])
        m["timing_s/step"] = end - start
        m["timing_s/controller"] = m["timing_s/step"] - covered(spans, start, end)
        update_span = next(x for x in timing.spans if x["stage"] == "update")
        m["timing_s/overlap"] = overlap(ahead.timing.spans, update_span) if ahead else 0.0
        append_spans(self.out / TIMELINE_FILE, timing.spans)
        if cfg.logging.log_samples:
            self._log_samples(batch_rows, scored)
        return m, ahead

    def _step_metrics(self, batch_rows: list[dict], scored: ScoredBatch, adv: np.ndarray,
                      actor_metrics: dict, timing: Timing) -> dict:
        samples, redundancy = scored.samples, scored.redundancy
        m: dict = {}
        if redundancy is not None:
            m |= summarise("rur/s_hist", redundancy.s_hist)
            m |= summarise("rur/s_group", redundancy.s_group) | summarise("rur/tau", redundancy.tau)
            m["reward/rur_mean"] = float(scored.reweighted.mean())
        n_tokens = sum(len(s.response_ids) for s in samples)
        m |= scored.metrics
        m |= {
            "reward/mean": float(scored.rewards.mean()),
            "reward/std": float(scored.rewards.std()),
            "response/length_mean": float(np.mean([len(s.response_ids) for s in samples])),
            "response/distinct_1": distinct_n(scored.replies, 1),
            "response/distinct_2": distinct_n(scored.replies, 2),
            "rollout/tokens_per_s": n_tokens / max(timing["rollout"], 1e-9),
            "data/epoch": (self.resume_cursor or self.loader.cursor.state())["epoch"],
            "data/visual_share": float(np.mean([bool(r.get("images")) for r in batch_rows])),
            "faults/actor_restarts": self.restarts,
            "sync/bytes": self.sync_bytes,
        }
        m |= summarise("advantages", adv)
        m |= {k: v for k, v in actor_metrics.items() if isinstance(v, (int, float))}
        m |= {f"timing_s/{k}": v for k, v in timing.items()}
        return m

    def _log_samples(self, rows: list[dict], scored: ScoredBatch) -> None:
        """Generated text and judge answers: sensitive, so only with logging.log_samples."""
        redundancy = scored.redundancy
        # whole conversations: which dialogue and turn each sample is, what the seeker said
        place = [(d, t, x) for d, x in enumerate(scored.dialogues or [])
                 for t in range(len(x.turns))]

        with open_append(self.out / "samples.jsonl") as fh:
            for k, s in enumerate(scored.samples):
                rec = {"step": self.step + 1, "prompt_id": rows[s.uid % len(rows)].get("id"),
                       "uid": s.uid, "text": s.text, "judge": scored.judge_raw[k],
                       "reward": float(scored.rewards[k]),
                       "reweighted_reward": float(scored.reweighted[k])}
                if place:
                    d, t, x = place[k]
                    turn = x.turns[t]
                    rec |= {"dialogue": d, "turn": t + 1, "change": turn.change,
                            "emotion": turn.emotion, "seeker": turn.seeker, "end": x.end,
                            "advantage": float(scored.advantages[k])}
                    if t == 0:        # the seeker's first message (written by it for a card)
                        rec["opening"] = x.profile.opening
                if redundancy is not None:
                    rec |= {key: float(getattr(redundancy, key)[k])
                            for key in ("s_hist", "s_group", "tau")}
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")

    def evaluate(self) -> dict:
        """`trainer.eval_freq`: diversity + safety of the synced policy via the pools."""
        t = time.perf_counter()
        # through the worker group: a redundancy worker restarted meanwhile is waited for
        m = self.evaluator.run(self.rollout, self.reward_model,
                               lambda texts: self.redundancy.call("encode", texts), self.step)
        m["timing_s/eval"] = time.perf_counter() - t
        return m

    # ---------------------------------------------------------------- the loop
    def fit(self, stop=None, plot: bool = True) -> int:
        """Steps until trainer.total_steps, or until a SIGTERM / SIGINT (`stop`, a
        peer_rl.trainer.preemption.StopRequest; one is made if not given): then the step in progress
        finishes and is checkpointed, and `stopped_by` names the signal. `plot=False` leaves the
        figures to the caller (`plot()`), which can draw them while the pools shut down."""
        total, save_freq = self.cfg.trainer.total_steps, self.cfg.trainer.save_freq
        bar = progress_bar(total=total, initial=self.step, desc="grpo", unit="step")
        ckpt = latest_checkpoint(self.out) if self.step == total else None
        ahead = None         # the next step's batch, already scored (trainer.async_training)
        with (nullcontext(stop) if stop is not None else StopRequest()) as stop, \
                self.metrics.closed_on_error():
            while self.step < total and not stop.signal:
                look_ahead = bool(self.staleness) and self.step + 1 < total and not stop.signal
                metrics, ahead = self.train_step(None, ahead, look_ahead)
                self.step += 1
                # after a stop signal the checkpoint comes first: an evaluation against a slow
                # judge endpoint could outlast the scheduler's grace period and lose the step
                if self.evaluator is not None and self.step % self.cfg.trainer.eval_freq == 0 \
                        and not stop.signal:
                    metrics |= self.evaluate()
                self.metrics.log(self.step, metrics)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.2f}", refresh=False)
                bar.update(1)
                if (save_freq and self.step % save_freq == 0) or self.step == total \
                        or stop.signal:
                    ckpt = self.save_checkpoint()
                    if self.step < total:     # a run stopped between checkpoints still has one
                        self.write_memory()
                        self.plot_later()     # the last step's figures: drawn at the end
            self.stopped_by = stop.signal
        bar.close()
        if self.step == total and ckpt is not None:
            self.export_final()
        self.metrics.close()
        self.write_memory()
        if plot:
            self.plot()
        return self.step

    def plot(self) -> None:
        """The run's figures now (peer_rl.trainer.figures), after any drawn in the background."""
        self.plot_later().result()

    def plot_later(self) -> Future:
        """The run's figures drawn on the controller's figure thread (~1 s of matplotlib, one
        figure at a time) while the run goes on: after every checkpoint, so a run that dies
        has the figures of its last one."""
        return self.figures.submit(draw_figures, self.out, self.out, self.cfg.experiment_name,
                                   self.staleness)
