"""GPU check of the cluster path, for a machine with torch and transformers only (no Ray, no vLLM).

    python benchmarks/gpu_check.py                 # Qwen2.5-7B shape, on the first GPU
    python benchmarks/gpu_check.py --layers 4      # same widths, fewer layers (a smaller GPU)
    python benchmarks/gpu_check.py --smoke         # a tiny shape on CPU: checks the script runs

1. One FSDP2 update step of a random Qwen2.5-7B-shaped policy with the project's own worker
   (workers.policy.PolicyWorker: bf16 compute over fp32 master weights, chunked log-probs,
   token-budget micro-batches, gradient checkpointing, the reference offloaded to host memory):
   seconds, tokens/s, model FLOPs utilisation against the GPU's bf16 dense peak (6 x params x
   tokens per step; attention FLOPs not counted, so the figure is a lower bound), peak memory.
2. The weight sync's bucketed broadcast of the same parameter set (workers.weight_sync: each
   tensor gathered, cast to bf16 and packed into `--bucket-mb` buckets, broadcast over an NCCL
   group). One GPU has no peer to send to, so the group has one member: the figure is the
   sender's cost (gather, cast, pack, launch); the transfer itself adds bytes / link bandwidth.
Prints one table; `--json FILE` also writes the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# H100/H200 SXM bf16 dense tensor-core peak; other GPUs: pass --peak-tflops
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}
QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064)
SMOKE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=2, vocab_size=4096)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(shape: dict, out: Path, device: str) -> int:
    """A random Qwen2 checkpoint (bf16 on disk) at `out`; returns its parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**shape, max_position_embeddings=32768, tie_word_embeddings=False,
                      torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    del model
    return n


def update_step(path: str, tokens: int, seq: int) -> dict:
    import numpy as np
    import torch

    from peer_rl.protocol import UpdateBatch
    from peer_rl.worker_settings import PolicySettings
    from workers.policy import PolicyWorker

    rows = max(1, tokens // seq)
    t0 = time.perf_counter()
    w = PolicyWorker(0, 1, "127.0.0.1", _port(), path, PolicySettings(
        lr=1e-6, ppo_mini_batch_size=rows, ppo_micro_batch_size=rows,
        ppo_max_token_len_per_gpu=tokens, logits_chunk_size=1024, gradient_checkpointing=True,
        ref_param_offload=True))
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    vocab = w.model.get_output_embeddings().weight.shape[0]
    resp = np.zeros((rows, seq), np.int64)
    resp[:, seq // 2:] = 1
    batch = UpdateBatch(rng.integers(0, vocab, (rows, seq)), np.ones((rows, seq), np.int64), resp,
                        rng.standard_normal(rows).astype(np.float32))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    metrics = w.update(batch)             # old + reference log-probs, then the training step
    if cuda:
        torch.cuda.synchronize()
    sec = time.perf_counter() - t0
    return {"worker": w, "load_s": load_s, "update_s": sec, "tokens": rows * seq,
            "train_s": metrics["timing_s/update_actor"],
            "logprob_s": metrics["timing_s/old_ref_log_prob"],
            "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else float("nan")}


def broadcast(w, bucket_mb: float) -> dict:
    import torch

    dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    metas = w.weight_metas(dtype)
    addr, port = w.host_weight_sync(1)
    w.join_weight_sync()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    stats = w.send_weights(metas, int(bucket_mb * 2**20))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {"sync_s": time.perf_counter() - t0, "sync_gb": stats["bytes"] / 1e9}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 28)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--bucket-mb", type=float, default=256.0)
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny shape on CPU")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda and not args.smoke:
        print("no GPU: run with --smoke to check the script on CPU", file=sys.stderr)
        return 2
    shape = dict(SMOKE if args.smoke else QWEN25_7B)
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    if args.smoke:
        args.tokens, args.seq = 256, 64
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    with tempfile.TemporaryDirectory(prefix="peer-rl-gpu-check-") as tmp:
        t0 = time.perf_counter()
        n = build(shape, Path(tmp) / "model", "cuda" if cuda else "cpu")
        build_s = time.perf_counter() - t0
        print(f"[gpu-check] random model {n / 1e9:.2f}B params built in {build_s:.0f} s", flush=True)
        up = update_step(str(Path(tmp) / "model"), args.tokens, args.seq)
        print(f"[gpu-check] update step {up['update_s']:.2f} s", flush=True)
        sync = broadcast(up["worker"], args.bucket_mb)
        up["worker"].shutdown()
    tok_s = up["tokens"] / up["train_s"]
    mfu = 6 * n * tok_s / (peak * 1e12) if peak and cuda else None
    res = {"date": time.strftime("%Y-%m-%d"), "device": name, "params": n, "shape": shape,
           "tokens": up["tokens"], "load_s": up["load_s"], "update_s": up["update_s"],
           "train_s": up["train_s"], "logprob_s": up["logprob_s"], "train_tokens_per_s": tok_s,
           "mfu": mfu, "peak_gb": up["peak_gb"], **sync, "bucket_mb": args.bucket_mb}
    label = "smoke-test shape" if args.smoke else "Qwen2.5-7B-shaped"
    print(f"\n{name}, random {label} policy ({n / 1e9:.2f}B params, "
          f"{shape['num_hidden_layers']} layers), one FSDP2 rank, {up['tokens']} tokens")
    print(f"{'figure':40s} {'value':>12s}")
    rows = [("two policies loaded (s)", f"{up['load_s']:.1f}"),
            ("update call: old+ref log-probs (s)", f"{up['logprob_s']:.2f}"),
            ("update call: train fwd+bwd+step (s)", f"{up['train_s']:.2f}"),
            ("training tokens/s", f"{tok_s:.0f}"),
            ("MFU (6 N tokens / s / bf16 peak)", f"{100 * mfu:.1f}%" if mfu else "-"),
            ("peak GPU memory (GB)", f"{up['peak_gb']:.1f}"),
            ("sync: gather+cast+pack+broadcast (s)", f"{sync['sync_s']:.2f}"),
            ("sync: GB sent (bf16)" if cuda else "sync: GB sent", f"{sync['sync_gb']:.2f}")]
    for k, v in rows:
        print(f"{k:40s} {v:>12s}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
