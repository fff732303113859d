"""Scalar reward pool (ESCRAG-R1): a Bradley-Terry reward model served by vLLM's pooling runner.

The checkpoint is a `*ForSequenceClassification` with one label (what `peer-rl train-rm
recipe=escrag_rm` writes); vLLM loads it with `runner="pooling"` and `classify` returns its
logit at the last token, with no activation: the Bradley-Terry scale the policy is rewarded on.
A plain class; the placement layer makes it a Ray actor.
"""
from __future__ import annotations

import math
import os
import time

from peer_rl.protocol import Dispatch, ScalarItem, dispatch
from peer_rl.supervised.bradley_terry import rm_messages
from peer_rl.prompts.quoting import tokenizer_specials
from peer_rl.tracking.metrics import peak_rss_bytes
from peer_rl.config.worker_settings import JudgeSettings
from peer_rl.models.local import on_this_node
from peer_rl.workers.vllm_engine import engine_dtype, make_llm, on_cpu, shutdown


class ScalarRewardWorker:
    def __init__(self, model_path: str, settings: JudgeSettings | None = None, seed: int = 0):
        t0 = time.perf_counter()
        self.model_path = model_path = on_this_node(model_path)
        self.llm = make_llm(model_path, settings or JudgeSettings(), seed=seed, runner="pooling",
                            enable_prefix_caching=False, worker_extension_cls="")
        self.tokenizer = self.llm.get_tokenizer()
        self.max_len = self.llm.llm_engine.model_config.max_model_len
        self.start_seconds = time.perf_counter() - t0
        self.scored = 0

    @dispatch(Dispatch.SHARD)
    def score(self, items: list[ScalarItem]) -> list[float]:
        """The reward model's scalar per reply; a prompt longer than the context is kept whole
        by dropping its oldest turns (the reply is always scored)."""
        from vllm.pooling_params import PoolingParams  # deferred: vllm

        prompts = [self._prompt(it.history, it.reply, it.lang) for it in items]
        outs = self.llm.classify(prompts, pooling_params=PoolingParams(use_activation=False),
                                 use_tqdm=False)
        self.scored += len(items)
        scores = [float(o.outputs.probs[0]) for o in outs]
        return [s if math.isfinite(s) else 0.0 for s in scores]

    def _prompt(self, history: list[dict], reply: str, lang: str) -> dict:
        for start in range(len(history)):
            text = self.tokenizer.apply_chat_template(
                rm_messages(history[start:], reply, lang, tokenizer_specials(self.tokenizer)),
                tokenize=False)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) <= self.max_len:
                return {"prompt_token_ids": ids}
        return {"prompt_token_ids": ids[-self.max_len:]}

    def health(self) -> dict:
        return {"ok": True, "pid": os.getpid(), "model": self.model_path, "scored": self.scored,
                "device": "cpu" if on_cpu() else "cuda",
                "start_seconds": round(self.start_seconds, 2), "dtype": engine_dtype(self.llm),
                "peak_rss_bytes": peak_rss_bytes()}

    def close(self) -> None:
        shutdown(self.llm)
