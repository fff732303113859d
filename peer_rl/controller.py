"""The single controller: one GRPO step is eight stages (prompts, rollout, parse, UnifiReward,
RUR, advantages, policy update, weight sync), in that order in `train_step`.

The controller holds no model. It talks to the pools only through the Ray handles it is given
(see peer_rl.placement) and does the cheap, pure work itself (parsing, advantages, metrics).
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
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import ray
import torch

from peer_rl.algos import get_adv_estimator
from peer_rl.dataloader import Cursor, PromptLoader
from peer_rl.metrics import MetricsSink, distinct_n, summarise
from peer_rl.protocol import JudgeItem, Prompt, SamplingConfig, seeded, shard
from peer_rl.reasoning import parse_structured
from peer_rl.rewards import rur_reweight
from peer_rl.sync_group import WeightSyncGroup
from peer_rl.timeline import Timing, append_spans, covered, overlap, plot_timeline

STATE_FILE = "trainer_state.json"
PROMPTS_FILE = "prompts.json"     # ids of the run's prompt pool, in pool order
TIMELINE_FILE = "timeline.jsonl"  # every stage's wall-clock span, per step
RECOVERY_TIMEOUT_S = float(os.environ.get("PEER_RL_RECOVERY_TIMEOUT_S", "600"))


class PolicyGroupFailed(RuntimeError):
    """A policy rank died: the FSDP group cannot continue; resume from the last checkpoint."""


class EngineRestarted(RuntimeError):
    """A rollout engine answered with the initial checkpoint's weights: it was restarted."""


@dataclass
class Pools:
    """Ray actor handles, one list per pool (see peer_rl.placement.make_pools)."""
    rollout: list
    reward_model: list
    actor: list                      # FSDP2 ranks, rank 0 first
    redundancy: list = field(default_factory=list)
    retrieval: list = field(default_factory=list)
    restart: object = None           # callable(pool_name, index) -> new handle (fault tolerance)


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint: its state file is written last, inside the final rename."""
    ckpts = [p for p in (output_dir / "checkpoints").glob("step_*")
             if p.is_dir() and not p.name.endswith(".tmp") and (p / STATE_FILE).exists()]
    return max(ckpts, key=lambda p: int(p.name.split("_")[1]), default=None)


def resume_checkpoint(cfg, output_dir: Path) -> Path | None:
    """The checkpoint `resume=` points at: None (disable), the newest complete one (auto), or
    the directory given."""
    if cfg.resume == "disable":
        return None
    if cfg.resume == "auto":
        return latest_checkpoint(Path(output_dir))
    return Path(cfg.resume)


def saved_prompt_selection(checkpoint: Path | None) -> list[str] | None:
    """Ids of the prompt pool a checkpointed run trained on (None: no checkpoint, or one
    written before pools were saved)."""
    path = checkpoint / PROMPTS_FILE if checkpoint is not None else None
    if path is None or not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))["ids"]


def judge_frames(row: dict) -> list[str]:
    """The frame the judge sees in its Step 2 round: the last of the row's frames. SER rows,
    which the judge is trained on, show one frame; GRPO visual rows carry two, taken at 1/2 and
    3/4 of the seeker's utterance, and the later one is the expression the reply answers."""
    return list(row.get("images") or [])[-1:]


def update_batch(samples: list, advantages: np.ndarray, max_staleness: int = 0) -> dict:
    """The policy update's input: right-padded prompt + response rows, the response mask (the
    loss covers response tokens only), advantages; with a staleness bound, also the sampler's
    log-probs and each sample's policy version (decoupled PPO's weight, the bound's check)."""
    seqs = [s.prompt_ids + s.response_ids for s in samples]
    T = max(len(x) for x in seqs)
    n = len(seqs)
    input_ids = np.zeros((n, T), dtype=np.int64)
    attention = np.zeros((n, T), dtype=np.int64)
    response = np.zeros((n, T), dtype=np.int64)
    for i, (s, seq) in enumerate(zip(samples, seqs)):
        input_ids[i, :len(seq)] = seq
        attention[i, :len(seq)] = 1
        response[i, len(s.prompt_ids):len(seq)] = 1
    batch = {"input_ids": input_ids, "attention_mask": attention, "response_mask": response,
             "advantages": advantages.astype(np.float32)}
    if max_staleness:
        behavior = np.zeros((n, T), dtype=np.float32)
        for i, s in enumerate(samples):
            start = len(s.prompt_ids)
            behavior[i, start:start + len(s.response_logprobs)] = s.response_logprobs
        batch |= {"behavior_log_probs": behavior, "max_staleness": max_staleness,
                  "policy_versions": np.array([s.policy_version for s in samples])}
    if any(s.images for s in samples):   # the frames the engine saw: the update sees them too
        batch["images"] = [list(s.images) for s in samples]
    return batch


class Controller:
    def __init__(self, cfg, pools: Pools, rows: list[dict], output_dir: Path):
        self.cfg, self.pools, self.out = cfg, pools, Path(output_dir)
        self.G = cfg.rollout.n
        self.step = 0
        self.scoring_step = 0            # the step (0-based) stages 2-5 are working for
        self.restarts = 0                # rollout/judge actors recovered (cumulative)
        self.staleness = cfg.trainer.async_training.staleness
        self.weight_sync = WeightSyncGroup(
            self._policy_call, lambda: self.pools.rollout,
            lambda i: self._wait_alive("rollout", i),
            tensor_parallel_size=cfg.rollout.tensor_model_parallel_size,
            bucket_mb=cfg.actor.weight_sync_bucket_mb, max_retries=cfg.trainer.max_actor_restarts)
        cursor = None
        resume_dir = self._resume_dir()
        if resume_dir is not None:
            state = json.loads((resume_dir / STATE_FILE).read_text())
            self.step, cursor = state["step"], Cursor(**state["cursor"])
        # the version is the policy's own update count (restored with its checkpoint), so the
        # stamps engines put on samples and the policy's staleness check count alike
        self.policy_version = self._policy_call("health")[0]["global_step"]
        self.synced_version = self.policy_version  # what every engine's weights are now
        self.resume_cursor: dict | None = None   # the data cursor after self.step's batch
        self.loader = PromptLoader(rows, cfg.data.train_batch_size, cfg.data.seed,
                                   cfg.data.shuffle, cursor)
        self.metrics = MetricsSink(self.out, list(cfg.trainer.loggers),
                                   resume_step=self.step if resume_dir else None)
        self.evaluator = None
        if cfg.trainer.eval_freq:    # inputs are read now: a bad file fails before step 1
            from peer_rl.evaluation.in_training import InTrainingEval

            self.evaluator = InTrainingEval(cfg)
        if resume_dir is not None:
            print(f"[peer-rl] resuming from {resume_dir} (step {self.step})", flush=True)
            self._policy_call("load_checkpoint", str(resume_dir / "policy"))
            self.policy_version = self._policy_call("health")[0]["global_step"]
        held = {ray.get(h.health.remote())["policy_version"] for h in self.pools.rollout}
        if held != {self.policy_version}:   # engines hold other weights than the policy
            self._sync_weights()

    # ---------------------------------------------------------------- resume / checkpoints
    def _resume_dir(self) -> Path | None:
        return resume_checkpoint(self.cfg, self.out)

    def save_checkpoint(self) -> Path:
        """Write step_N.tmp, then rename: a crash never leaves a checkpoint that looks complete.
        The data cursor saved is the one after this step's batch: a batch already drawn and
        scored for the next step (trainer.async_training) is drawn and sampled again on resume."""
        final = self.out / "checkpoints" / f"step_{self.step}"
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "policy").mkdir(parents=True)
        self._policy_call("save_checkpoint", str(tmp / "policy"), self.cfg.trainer.save_hf_model)
        cursor = self.resume_cursor or self.loader.cursor.state()
        state = {"step": self.step, "cursor": cursor,
                 "seed": self.cfg.trainer.seed, "experiment_name": self.cfg.experiment_name}
        (tmp / PROMPTS_FILE).write_text(json.dumps({"ids": [r["id"] for r in self.loader.rows]}),
                                        encoding="utf-8")
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final

    def export_final(self) -> Path:
        """<output_dir>/final: the trained policy as a plain Hugging Face model directory
        (what `peer-rl eval`, `peer-rl chat` and vLLM load), written beside and renamed into
        place like `train-rm`'s final/."""
        final, tmp = self.out / "final", self.out / "final.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self._policy_call("export_hf", str(tmp))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final

    # ---------------------------------------------------------------- fault tolerance
    def _wait_alive(self, pool: str, i: int):
        """Ray restarts a crashed rollout/judge actor (max_restarts); wait until it answers."""
        handle = getattr(self.pools, pool)[i]
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while True:
            try:
                ray.get(handle.health.remote(), timeout=60)
                return handle
            except ray.exceptions.ActorDiedError as exc:
                # restarts exhausted: replace the actor if the placement layer can
                if self.pools.restart is None:
                    raise RuntimeError(f"{pool} worker {i} died and cannot be restarted: {exc}")
                handle = self.pools.restart(pool, i)
                getattr(self.pools, pool)[i] = handle
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{pool} worker {i} did not come back within "
                                   f"{RECOVERY_TIMEOUT_S:.0f} s (PEER_RL_RECOVERY_TIMEOUT_S)")
            time.sleep(2.0)

    def _map_pool(self, pool: str, method: str, chunks: list, *args) -> list:
        """Call `method(chunk, *args)` on each worker of a stateless pool, in order.

        A worker that dies mid-call is restarted by Ray; the controller waits for it, re-syncs
        the policy weights into it (rollout), and re-runs only that worker's chunk. Nothing of
        the failed attempt is kept, so a retried step counts once.
        """
        handles = getattr(self.pools, pool)
        refs = {i: getattr(h, method).remote(c, *args)
                for i, (h, c) in enumerate(zip(handles, chunks)) if c}
        out: dict[int, list] = {}
        for i, ref in refs.items():
            for attempt in range(self.cfg.trainer.max_actor_restarts + 1):
                try:
                    result = ray.get(ref)
                    if pool == "rollout" and method == "generate":
                        self._check_engine_weights(i, result)
                    out[i] = result
                    break
                except (ray.exceptions.RayActorError, EngineRestarted) as exc:
                    if attempt == self.cfg.trainer.max_actor_restarts:
                        raise RuntimeError(f"{pool} worker {i} failed {attempt + 1} time(s) in "
                                           f"step {self.scoring_step + 1}; giving up: {exc}"
                                           ) from None
                    what = ("restarted between calls" if isinstance(exc, EngineRestarted)
                            else f"died during step {self.scoring_step + 1}")
                    print(f"[peer-rl] {pool} worker {i} {what} ({type(exc).__name__}); "
                          "restarting and retrying its chunk", file=sys.stderr, flush=True)
                    self.restarts += 1
                    handle = self._wait_alive(pool, i)
                    if pool == "rollout":  # a restarted engine holds the initial checkpoint
                        self.weight_sync.invalidate()
                        self._sync_weights()
                    ref = getattr(handle, method).remote(chunks[i], *args)
        return [out[i] for i in sorted(out)]

    def _check_engine_weights(self, i: int, samples: list) -> None:
        """An engine that died while idle is restarted by Ray before the next call reaches it,
        so the call succeeds on the initial checkpoint; its stamp gives it away."""
        stale = {s.policy_version for s in samples} - {self.synced_version}
        if stale:
            raise EngineRestarted(f"rollout worker {i} sampled with policy version "
                                  f"{sorted(stale)}, the engines were synced to "
                                  f"{self.synced_version}")

    def _policy_call(self, method: str, *args) -> list:
        """All ranks of the FSDP group, together; a dead rank ends the run (no partial state)."""
        return self._policy_collect(self._policy_submit(method, *args))

    def _policy_submit(self, method: str, *args) -> list:
        return [getattr(a, method).remote(*args) for a in self.pools.actor]

    def _policy_collect(self, refs: list) -> list:
        """Results are collected as they finish so that a dead rank is seen at once, not after
        the survivors time out in a collective; the survivors are then killed."""
        pending, results = list(refs), {}
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                results[ready[0]] = ray.get(ready[0])
        except ray.exceptions.RayActorError as exc:
            for a in self.pools.actor:
                ray.kill(a, no_restart=True)
            ckpt = latest_checkpoint(self.out)
            raise PolicyGroupFailed(
                f"a policy rank died during step {self.step + 1} ({type(exc).__name__}); the "
                f"FSDP group cannot continue. Last complete checkpoint: "
                f"{ckpt if ckpt else 'none'}. Rerun with resume=auto to continue from it.") from None
        return [results[r] for r in refs]

    # ---------------------------------------------------------------- the stages
    def _generate(self, prompts: list[Prompt]) -> list:
        seeded(prompts, self.cfg.trainer.seed, self.scoring_step, "rollout", self.G)
        sampling = SamplingConfig(n=self.G, temperature=self.cfg.rollout.temperature,
                                  top_p=self.cfg.rollout.top_p,
                                  max_tokens=self.cfg.rollout.response_length,
                                  seed=self.cfg.trainer.seed)
        parts = self._map_pool("rollout", "generate", shard(prompts, len(self.pools.rollout)),
                               sampling)
        return [s for part in parts for s in part]

    def _judge(self, items: list[JudgeItem]) -> list:
        parts = self._map_pool("reward_model", "score",
                               shard(items, len(self.pools.reward_model)))
        return [r for part in parts for r in part]

    def _sync_weights(self) -> None:
        """Policy -> engines over the weight-sync group (peer_rl.sync_group). A resync after an
        engine restart during an overlapped update stamps the version before that update, while
        the weights sent may already include it: the stamp can only overstate a sample's age."""
        self.weight_sync.sync(version=self.policy_version)
        self.synced_version = self.policy_version

    def rollout(self, batch_rows: list[dict], timing: dict | None = None) -> list:
        """Stage 2: G samples per prompt from the rollout pool."""
        timing = Timing(self.scoring_step + 1) if timing is None else timing
        prompts = [Prompt(uid=i, messages=r["messages"], images=list(r.get("images") or []))
                   for i, r in enumerate(batch_rows)]
        t = time.perf_counter()
        samples = self._generate(prompts)
        timing["rollout"] = time.perf_counter() - t
        if len(samples) != len(prompts) * self.G:
            raise RuntimeError(f"rollout returned {len(samples)} samples for "
                               f"{len(prompts)} prompts x n={self.G}")
        return samples

    def score_batch(self, batch_rows: list[dict], timing: dict | None = None,
                    samples: list | None = None) -> dict:
        """Stages 2-5: rollout (unless samples are given), parse, UnifiReward, RUR.

        No weights change here.
        """
        cfg, G = self.cfg, self.G
        timing = Timing(self.scoring_step + 1) if timing is None else timing
        if samples is None:
            samples = self.rollout(batch_rows, timing)

        parsed = [parse_structured(s.text) for s in samples]             # 3. parse + format
        replies = [p.reply(s.text) for p, s in zip(parsed, samples)]
        coin = np.random.default_rng([cfg.trainer.seed, self.scoring_step]).random(len(samples))
        coin = coin < 0.5
        items = []
        for k, (s, p, reply) in enumerate(zip(samples, parsed, replies)):
            row = batch_rows[s.uid]
            items.append(JudgeItem(history=row["history"], lang=row["language"],
                                   steps=[p.steps.get(j) or None for j in (1, 2, 3)],
                                   reply=reply, reference=row["solution"],
                                   candidate_first=bool(coin[k]), format_complete=p.complete,
                                   images=judge_frames(row)))

        t = time.perf_counter()                                          # 4. UnifiReward
        results = self._judge(items)
        timing["judge"] = time.perf_counter() - t
        rewards = np.array([r.reward for r in results], dtype=np.float64)

        t = time.perf_counter()                                          # 5. RUR
        red = None
        final = rewards
        if cfg.algorithm.rur.enable:
            histories = [[u["content"] for u in r["history"]] for r in batch_rows]
            red = self._map_pool("redundancy", "similarities", [replies], histories, G)[0]
            final = rur_reweight(rewards, red["s_hist"], red["s_group"], red["tau"])
        timing["redundancy"] = time.perf_counter() - t
        verdicts = np.array([[v is True for v in r.step_verdicts] for r in results])
        asked = sum(r.asked for r in results)
        metrics = {
            "reward/format_rate": float(np.mean([p.complete for p in parsed])),
            "reward/step1_true_rate": float(verdicts[:, 0].mean()),
            "reward/step2_true_rate": float(verdicts[:, 1].mean()),
            "reward/step3_true_rate": float(verdicts[:, 2].mean()),
            "reward/preference_ok_rate": float(np.mean([r.preference_ok is True for r in results])),
            "judge/parse_failure_rate": sum(r.parse_failures for r in results) / max(asked, 1),
            "judge/asked": asked,
        }
        return {"samples": samples, "parsed": parsed, "replies": replies, "results": results,
                "rewards": rewards, "final": final, "redundancy": red, "metrics": metrics,
                "judge_raw": [r.raw for r in results]}

    def _score(self, batch_rows: list[dict], timing: dict) -> dict:
        """The method's stages 2-5: PEER (one pass, UnifiReward) or ESCRAG-R1 (the `<think>`
        prompt, scalar reward, two passes with retrieval unless retrieval.enable=false;
        peer_rl.rag_rollout)."""
        if self.cfg.reward_model.kind == "scalar":
            from peer_rl.rag_rollout import score_escrag

            return score_escrag(self, batch_rows, timing)
        return self.score_batch(batch_rows, timing)

    def _score_ahead(self, batch_rows: list[dict]) -> tuple[dict, Timing]:
        """Stages 2-5 of the next step (run in a second thread while this step updates)."""
        timing = Timing(self.step + 2)
        self.scoring_step = self.step + 1
        try:
            return self._score(batch_rows, timing), timing
        finally:
            self.scoring_step = self.step

    def train_step(self, batch_rows: list[dict], scored: dict | None = None,
                   timing: Timing | None = None, next_rows: list[dict] | None = None
                   ) -> tuple[dict, tuple | None]:
        """One GRPO step. `scored`/`timing`: its stages 2-5, when they already ran during the
        previous update; `next_rows`: the next step's batch, scored while this step updates
        (trainer.async_training). Returns (metrics, (next_rows, scored, timing) or None)."""
        cfg = self.cfg
        start = time.time()
        self.scoring_step = self.step
        if scored is None:
            timing = Timing(self.step + 1)
            scored = self._score(batch_rows, timing)
        samples, final = scored["samples"], scored["final"]
        rewards, replies, red = scored["rewards"], scored["replies"], scored["redundancy"]

        uid = torch.tensor([s.uid for s in samples])                     # 6. advantages
        adv = get_adv_estimator(cfg.algorithm.adv_estimator)(
            torch.as_tensor(final), uid,
            norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo).numpy()

        t = time.perf_counter()                                          # 7. policy update
        batch = update_batch(samples, adv, self.staleness)
        batch["temperature"] = float(cfg.rollout.temperature)
        # one object in the store, read by every rank (passing the dict would serialise it
        # once per rank)
        refs = self._policy_submit("update", ray.put(batch))
        ahead = None
        if next_rows is None:
            actor_metrics = self._policy_collect(refs)[0]
            timing["update"] = time.perf_counter() - t
        else:
            with ThreadPoolExecutor(1, thread_name_prefix="score-ahead") as pool:
                future = pool.submit(self._score_ahead, next_rows)
                actor_metrics = self._policy_collect(refs)[0]
                timing["update"] = time.perf_counter() - t
                ahead = (next_rows, *future.result())
        self.policy_version += 1

        t = time.perf_counter()                                          # 8. weight sync
        self._sync_weights()
        timing["sync"] = time.perf_counter() - t

        m: dict = {}
        if red is not None:
            m |= summarise("rur/s_hist", red["s_hist"]) | summarise("rur/s_group", red["s_group"])
            m |= summarise("rur/tau", red["tau"])
            m["reward/rur_mean"] = float(final.mean())
        n_tokens = sum(len(s.response_ids) for s in samples)
        m |= scored["metrics"]
        m |= {
            "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()),
            "response/length_mean": float(np.mean([len(s.response_ids) for s in samples])),
            "response/distinct_1": distinct_n(replies, 1),
            "response/distinct_2": distinct_n(replies, 2),
            "rollout/tokens_per_s": n_tokens / max(timing["rollout"], 1e-9),
            "data/epoch": (self.resume_cursor or self.loader.cursor.state())["epoch"],
            "data/visual_share": float(np.mean([bool(r.get("images")) for r in batch_rows])),
            "faults/actor_restarts": self.restarts + self.weight_sync.recoveries,
        }
        m |= summarise("advantages", adv)
        m |= {k: v for k, v in actor_metrics.items() if isinstance(v, (int, float))}
        m |= {f"timing/{k}": v for k, v in timing.items()}
        # wall time of this call: with the overlap, this step's stages 2-5 ran in the previous
        # call and the next step's run inside this one (timing/overlap: inside the update)
        end = time.time()
        spans = timing.spans + (ahead[2].spans if ahead else [])
        m["timing/step"] = end - start
        m["timing/controller"] = m["timing/step"] - covered(spans, start, end)
        update_span = next(x for x in timing.spans if x["stage"] == "update")
        m["timing/overlap"] = overlap(ahead[2].spans, update_span) if ahead else 0.0
        append_spans(self.out / TIMELINE_FILE, timing.spans)
        if cfg.logging.log_samples:
            self._log_samples(batch_rows, scored)
        return m, ahead

    def _log_samples(self, rows: list[dict], scored: dict) -> None:
        """Generated text and judge answers: sensitive, so only with logging.log_samples."""
        red = scored["redundancy"] or {}
        with open(self.out / "samples.jsonl", "a", encoding="utf-8") as fh:
            for k, s in enumerate(scored["samples"]):
                rec = {"step": self.step + 1, "prompt_id": rows[s.uid % len(rows)].get("id"),
                       "uid": s.uid, "text": s.text, "judge": scored["judge_raw"][k],
                       "reward": float(scored["rewards"][k]),
                       "final_reward": float(scored["final"][k])}
                rec |= {key: float(red[key][k]) for key in ("s_hist", "s_group", "tau") if red}
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")

    def evaluate(self) -> dict:
        """`trainer.eval_freq`: diversity + safety of the synced policy via the pools."""
        t = time.perf_counter()
        embedder = self.pools.redundancy[0]
        m = self.evaluator.run(self._map_pool, self.pools,
                               lambda texts: ray.get(embedder.encode.remote(texts)), self.step)
        m["timing/eval"] = time.perf_counter() - t
        return m

    # ---------------------------------------------------------------- the loop
    def fit(self) -> int:
        from tqdm import tqdm

        total, save_freq = self.cfg.trainer.total_steps, self.cfg.trainer.save_freq
        bar = tqdm(total=total, initial=self.step, desc="grpo", unit="step", dynamic_ncols=True)
        ckpt = latest_checkpoint(self.out) if self.step == total else None
        ahead = None         # the next step's batch, already scored (trainer.async_training)
        while self.step < total:
            rows, scored, timing = ahead or (self.loader.next_batch(), None, None)
            self.resume_cursor = self.loader.cursor.state()
            next_rows = None
            if self.staleness and self.step + 1 < total:
                next_rows = self.loader.next_batch()
            metrics, ahead = self.train_step(rows, scored, timing, next_rows)
            self.step += 1
            if self.evaluator is not None and self.step % self.cfg.trainer.eval_freq == 0:
                metrics |= self.evaluate()
            self.metrics.log(self.step, metrics)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.2f}")
            if (save_freq and self.step % save_freq == 0) or self.step == total:
                ckpt = self.save_checkpoint()
        bar.close()
        if self.step == total and ckpt is not None:
            self.export_final()
        self.metrics.close()
        from peer_rl.plot import plot_curves

        plot_curves(self.out / "metrics.jsonl", ["reward/mean", "reward/format_rate",
                                                 "reward/rur_mean", "judge/parse_failure_rate"],
                    self.out / "curves.png", title=f"{self.cfg.experiment_name}: GRPO")
        mode = f"staleness {self.staleness}" if self.staleness else "synchronous"
        plot_timeline(self.out / TIMELINE_FILE, self.out / "timeline.png",
                      title=f"{self.cfg.experiment_name}: stages of the last steps ({mode})")
        return self.step
