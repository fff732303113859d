"""UnifiReward worker: the generative judge scoring process (Steps 1-3) and outcome (reply).

Scoring is 4 batched greedy rounds: every item's next round at once, each round's conversation
carrying the judge's earlier answers as assistant turns (system + 4 x (user, assistant), laid out
by peer_rl.prompts.judge_rounds, which the verl plug-in shares), so the shared system/history
prefix is served from vLLM's prefix cache.
A judge whose template has role `process` (a PRM) is asked rounds 1-3 only, one with role
`outcome` (an ORM) one turn with the history and both replies; PairRewardWorker holds one of
each and scores like UnifiReward (`reward_model.kind=prm_orm`, PEER's comparison).
A plain class, no Ray import: the placement layer makes it an actor.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

from peer_rl.prompts.judge import JudgeTemplate, TEMPLATE_FILE
from peer_rl.prompts.judge_rounds import JudgeRounds, answer_all, judge_result
from peer_rl.prompts.multimodal import attach_images, for_vllm
from peer_rl.protocol import Dispatch, dispatch, JudgeItem, JudgeResult
from peer_rl.tracking.metrics import peak_rss_bytes
from peer_rl.config.worker_settings import JudgeSettings
from peer_rl.models.local import check_adapter_dir, on_this_node
from peer_rl.workers.vllm_engine import engine_dtype, lora_engine_args, make_llm, shutdown

STEP2_ROUND = 1          # rounds 0-2 judge Steps 1-3; round 3 compares the replies
OUTCOME_ROUND = 3


class UnifiRewardWorker:
    """Judges JudgeItems with the template saved next to the reward model.

    Missing steps (None) are not asked: no user turn, verdict None, score 0. The dialogue history
    is shown in the first turn actually asked (round 1 in the trained layout). Unparseable
    answers score 0 and are counted in `parse_failures`, never raised.
    """

    def __init__(self, model_path: str, settings: JudgeSettings | None = None, seed: int = 0,
                 lora_path: str = ""):
        """`lora_path`: a PEFT adapter of `model_path` (reward_model.lora_path); the engine
        serves the base plus it, and the judge template is the adapter's."""
        t0 = time.perf_counter()
        s = settings or JudgeSettings()
        self.model_path = model_path = on_this_node(model_path)
        self.lora_request, lora_args = None, {}
        if lora_path:
            self.lora_request, lora_args = judge_adapter(on_this_node(lora_path))
        self.template = JudgeTemplate.load(self.lora_request.lora_path if lora_path
                                           else model_path)
        self.max_tokens, self.weights = s.max_tokens, s.weights
        self.llm = make_llm(model_path, s, seed=seed, enable_prefix_caching=True, **lora_args)
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self.tokenizer = self.llm.get_tokenizer()
        self.multimodal = bool(self.llm.llm_engine.model_config.is_multimodal_model)
        self.rounds = JudgeRounds(self.template, self.tokenizer, self.max_model_len,
                                  self.max_tokens)
        self.start_seconds = time.perf_counter() - t0

    def answer(self, conversations: list[list[dict]]) -> list[str]:
        """One batched greedy call: the next judge turn of each conversation (one round)."""
        from vllm import SamplingParams  # deferred: vllm

        params = SamplingParams(temperature=0.0, max_tokens=self.max_tokens)
        outs = self.llm.chat([for_vllm(c) for c in conversations], params, use_tqdm=False,
                             lora_request=self.lora_request)
        return [o.outputs[0].text.strip() for o in outs]

    @dispatch(Dispatch.SHARD)
    def chat(self, conversations: list[list[dict]], max_tokens: int, temperature: float = 0.0,
             schema: dict | None = None) -> list[str]:
        """Free-form answers from the judge's engine (the in-training safety evaluation uses it
        as its judge); `schema`: JSON the answers must follow."""
        from vllm import SamplingParams  # deferred: vllm
        from vllm.sampling_params import StructuredOutputsParams  # deferred: vllm

        params = SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                structured_outputs=StructuredOutputsParams(json=schema)
                                if schema is not None else None)
        outs = self.llm.chat([for_vllm(c) for c in conversations], params, use_tqdm=False,
                             lora_request=self.lora_request)
        return [o.outputs[0].text for o in outs]

    def _with_images(self, item: JudgeItem, turns: list[dict | None]) -> list[dict | None]:
        """The item's frame(s) in the round that judges Step 2 ("emotional state from the
        facial expression and the words"), as SER's visual rows show the judge one frame (an
        outcome model: in its one turn); a text-only judge, or an item without Step 2, gets the
        words alone."""
        at = OUTCOME_ROUND if self.template.role == "outcome" else STEP2_ROUND
        if not (self.multimodal and item.images) or turns[at] is None:
            return turns
        turns = list(turns)
        turns[at] = attach_images([turns[at]], list(item.images))[0]
        return turns

    @dispatch(Dispatch.SHARD)
    def score(self, items: list[JudgeItem]) -> list[JudgeResult]:
        return [judge_result(it, ans, self.weights) for it, ans in zip(items, self.answers(items))]

    def answers(self, items: list[JudgeItem]) -> list[list[str | None]]:
        """The judge's 4 answer slots per item (None where this judge does not ask): every
        item's next round in one batched call (judge_rounds.answer_all)."""
        dialogues = [self.rounds.dialogue(it, self._with_images(it, self.rounds.turns(it)))
                     for it in items]
        return answer_all(dialogues, self.answer)

    def health(self) -> dict:
        return {"ok": True, "pid": os.getpid(), "model": self.model_path,
                "template_version": self.template.version, "role": self.template.role,
                "multimodal": self.multimodal,
                "max_model_len": self.max_model_len, "start_seconds": round(self.start_seconds, 2),
                "dtype": engine_dtype(self.llm), "peak_rss_bytes": peak_rss_bytes()}

    def close(self) -> None:
        shutdown(self.llm)


def judge_adapter(path: str):
    """(LoRARequest, make_llm keywords) for a judge adapter directory; one that is not a PEFT
    adapter with its judge template fails here, naming reward_model.lora_path."""
    from vllm.lora.request import LoRARequest  # deferred: vllm

    check_adapter_dir(f"reward_model.lora_path={path!r}", path, also=(TEMPLATE_FILE,),
                      error=FileNotFoundError)
    d = Path(path)
    rank = int(json.loads((d / "adapter_config.json").read_text(encoding="utf-8"))["r"])
    return LoRARequest("judge", 1, str(d)), lora_engine_args(rank)


class PairRewardWorker:
    """A process model (PRM) and an outcome model (ORM) scoring together as UnifiReward does:
    the PRM answers rounds 1-3 (its step verdicts), the ORM the preference; the reward is
    PEER's (settings.weights: by default 0.5 a true step, 0.5 a reply at least as good as the
    reference, 1 the format).
    Each model must carry the template role of its slot, so swapped paths fail at start."""

    def __init__(self, model_path: str, outcome_path: str, settings: JudgeSettings | None = None,
                 seed: int = 0):
        # two engines in one actor, each scoring every item: they share its GPU share
        s = settings or JudgeSettings()
        s = replace(s, gpu_memory_utilization=s.gpu_memory_utilization / 2)
        self.process = UnifiRewardWorker(model_path, s, seed=seed)
        self.outcome = UnifiRewardWorker(outcome_path, s, seed=seed)
        for worker, role in ((self.process, "process"), (self.outcome, "outcome")):
            if worker.template.role != role:
                raise ValueError(
                    f"{worker.model_path}: its judge_template.json has role "
                    f"{worker.template.role!r}, expected {role!r} (train it with "
                    f"`peer-rl train-rm recipe={'prm' if role == 'process' else 'orm'}_tiny` "
                    "or the full-size recipe)")
        self.model_path, self.template = model_path, self.process.template
        self.tokenizer, self.max_tokens = self.process.tokenizer, self.process.max_tokens
        self.max_model_len = self.process.max_model_len
        self.multimodal, self.weights = self.process.multimodal, s.weights

    def answers(self, items: list[JudgeItem]) -> list[list[str | None]]:
        steps, prefs = self.process.answers(items), self.outcome.answers(items)
        return [s[:3] + p[3:] for s, p in zip(steps, prefs)]

    @dispatch(Dispatch.SHARD)
    def score(self, items: list[JudgeItem]) -> list[JudgeResult]:
        return [judge_result(it, a, self.weights) for it, a in zip(items, self.answers(items))]

    @dispatch(Dispatch.SHARD)
    def chat(self, conversations, max_tokens, temperature=0.0, schema=None):
        """Free-form answers (in-training safety judging) from the outcome model's engine."""
        return self.outcome.chat(conversations, max_tokens, temperature, schema)

    def health(self) -> dict:
        return {**self.process.health(), "outcome": self.outcome.health()}

    def close(self) -> None:
        self.process.close()
        self.outcome.close()
