"""`trainer.eval_freq`: diversity and a small safety evaluation of the current policy, run
through the training pools (the rollout pool answers, the reward-model pool's engine or an
HTTP endpoint judges, the redundancy pool embeds), logged as `eval/...` beside the step's
metrics. The same protocol programs as `peer-rl eval`, without a run store."""
from __future__ import annotations

import logging
from collections import defaultdict
from functools import partial
from pathlib import Path

from peer_rl.config.reward_kinds import reward_kind
from peer_rl.evaluation.cases import load_diversity_prompts, load_probes
from peer_rl.evaluation.diversity import diversity_case, diversity_metrics
from peer_rl.evaluation.endpoints import (Endpoint, EndpointConfig, HttpEndpoint, Reply,
                                          without_images)
from peer_rl.evaluation.runner import run_all
from peer_rl.evaluation.safety import safety_case, summarise_safety
from peer_rl.evaluation.supporter import Supporter
from peer_rl.prompts.multimodal import image_paths
from peer_rl.protocol import Prompt, SamplingConfig, seeded

log = logging.getLogger(__name__)


class PoolEndpoint(Endpoint):
    """A training pool as a party, through its worker group (peer_rl.trainer.worker_group: the
    controller's fault-tolerant fan-out)."""

    def __init__(self, role: str, group, max_tokens: int, temperature: float,
                 seed: int = 0, step: int = 0):
        self.name, self.group = f"{role} (training pool)", group
        self.cfg = EndpointConfig(max_tokens=max_tokens, temperature=temperature)
        self.seed, self.step, self.requests = seed, step, 0   # request seeds: protocol.seeded

    def _groups(self, requests):
        groups = defaultdict(list)
        for i, r in enumerate(requests):
            groups[(r.n,) + self._params(r) + (r.schema is not None,)].append(i)
        return groups.items()


class RolloutPoolEndpoint(PoolEndpoint):
    def chat(self, requests):
        replies = [None] * len(requests)
        for (n, max_tokens, temperature, _), idx in self._groups(requests):
            prompts = seeded([Prompt(uid=i, messages=without_images(requests[i].messages),
                                     images=image_paths(requests[i].messages)) for i in idx],
                             self.seed, self.step, "eval", n, start=self.requests)
            self.requests += len(idx)
            sampling = SamplingConfig(n=n, temperature=temperature, max_tokens=max_tokens,
                                      seed=self.seed)
            texts = defaultdict(list)
            for s in self.group.call("generate", prompts, sampling):
                texts[s.uid].append(s.text)
            for i in idx:
                replies[i] = Reply(texts=texts[i])
        return replies


class JudgePoolEndpoint(PoolEndpoint):
    def chat(self, requests):
        replies = [None] * len(requests)
        for (_, max_tokens, temperature, _), idx in self._groups(requests):
            for j in idx:
                assert requests[j].n == 1, "the judge pool answers one text per request"
            schema = requests[idx[0]].schema if self.cfg.structured else None
            convs = [requests[i].messages for i in idx]
            for i, text in zip(idx, self.group.call("chat", convs, max_tokens, temperature,
                                                       schema)):
                replies[i] = Reply(texts=[text])
        return replies


def spread_over_groups(probes: list, k: int) -> list:
    """The first k probes taken round-robin over the groups (crisis, harmful request, boundary
    all represented however the file is ordered)."""
    by_group = defaultdict(list)
    for p in probes:
        by_group[p.group].append(p)
    out, i = [], 0
    while len(out) < min(k, len(probes)):
        for g in sorted(by_group):
            if i < len(by_group[g]) and len(out) < k:
                out.append(by_group[g][i])
        i += 1
    return out


class InTrainingEval:
    def __init__(self, cfg, policy_template=None):
        from peer_rl.data.bundled import sample_root  # deferred: pulls in PIL

        e = cfg.eval
        root = Path(cfg.data.root or sample_root())
        self.cfg, self.e = cfg, e
        # the policy is asked as its training rows ask it (peer_rl.prompts.policy)
        kind = reward_kind(cfg.reward_model.kind)
        self.style = Supporter(kind.style, policy_template if kind.rows_prompt else None)
        self.prompts = load_diversity_prompts(root, e.diversity_pattern,
                                              cfg.data.skip_invalid).items[:e.diversity_prompts]
        self.probes = (spread_over_groups(load_probes(root, cfg.data.skip_invalid).items,
                                          e.safety_probes) if e.safety_probes else [])

    def _judge(self, reward_model) -> Endpoint:
        e = self.e
        if e.judge_url:
            return HttpEndpoint("eval.judge", EndpointConfig(
                url=e.judge_url, model=e.judge_model, api_key_env=e.judge_api_key_env,
                temperature=0.0, max_tokens=e.judge_max_tokens))
        return JudgePoolEndpoint("judge", reward_model, e.judge_max_tokens, 0.0)

    def run(self, rollout, reward_model, encode, step: int) -> dict:
        """The rollout and reward-model worker groups answer; `encode(texts)` -> unit
        embeddings (the redundancy pool)."""
        cfg, e = self.cfg, self.e
        model = RolloutPoolEndpoint("model", rollout,
                                    e.max_tokens or cfg.rollout.response_length,
                                    cfg.rollout.temperature, seed=cfg.trainer.seed, step=step)
        out: dict = {"eval/errors": 0}
        for part in (self._diversity, self._safety):
            try:
                out |= part(model, reward_model, encode)
            except Exception as exc:     # an evaluation never ends the training run
                out["eval/errors"] += 1
                log.warning(f"step {step}: in-training evaluation ({part.__name__[1:]}) "
                            f"failed and is skipped; training goes on: {type(exc).__name__}: {exc}")
        return {k: v for k, v in out.items() if v is not None}

    def _diversity(self, model, reward_model, encode) -> dict:
        if not self.prompts:
            return {}
        recs = run_all(self.prompts, partial(diversity_case, style=self.style, n=self.e.n),
                       {"model": model}, batch_cases=len(self.prompts))
        div = diversity_metrics([r["replies"] for r in recs], [r["history"] for r in recs],
                                encode)
        out = {f"eval/diversity/{k}": v for k, v in div.items() if isinstance(v, float)}
        fmt = [x for r in recs for x in r["format_ok"]]
        out["eval/diversity/format_rate"] = sum(fmt) / len(fmt)
        return out

    def _safety(self, model, reward_model, encode) -> dict:
        if not self.probes:
            return {}
        endpoints = {"model": model, "judge": self._judge(reward_model)}
        s = summarise_safety(run_all(self.probes, partial(safety_case, style=self.style),
                                     endpoints, batch_cases=len(self.probes)))
        out = {"eval/safety/pass_rate": s["overall"]["pass_rate"],
               "eval/safety/unparsed": s["overall"]["unparsed"], "eval/safety/errors": s["errors"]}
        for g, r in s["groups"].items():
            out[f"eval/safety/{g}_pass_rate"] = r["pass_rate"]
        return out
