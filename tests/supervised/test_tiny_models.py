"""Tiny offline models: the tokenizer reloads with identical ids, the model builds and generates."""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from peer_rl.supervised.tiny_models import EOS, PAD, build_tiny_causal_lm, build_tokenizer, default_corpus

TEXTS = [
    "Step 4: Response Generation. That sounds really hard; I'm here with you.",
    "步骤4： 回复生成。听起来你真的很难过，我在这里陪着你。",
    "Mixed 中英文 text, numbers 12345 and   spaces\n\n\tnew lines！？",
    "It's fine, we'll see; they've said you'd be OK.",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    build_tokenizer(root / "tok")
    build_tiny_causal_lm(root / "model", root / "tok", seed=3)
    return root


def test_tokenizer_reload_identity(built):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(built / "tok" / "tokenizer.json"))
    for path in (built / "tok", built / "model"):
        tok = AutoTokenizer.from_pretrained(str(path))
        assert type(tok).__name__ == "Qwen2Tokenizer"
        for text in TEXTS + default_corpus()[:20]:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert ids == raw.encode(text).ids
            assert tok.decode(ids) == raw.decode(ids, skip_special_tokens=False)
        assert tok.decode(tok(TEXTS[1], add_special_tokens=False)["input_ids"]) == TEXTS[1]
        assert tok.eos_token == EOS and tok.pad_token == PAD
        assert 500 < len(tok) <= 3000


def test_chat_template(built):
    tok = AutoTokenizer.from_pretrained(str(built / "model"))
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "你好"},
            {"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Q"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n你好<|im_end|>\n"
                    "<|im_start|>assistant\nHi<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    specials = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids.count(specials[0]) == 5 and ids.count(specials[1]) == 4


def test_model_builds_and_generates(built, tmp_path):
    tok = AutoTokenizer.from_pretrained(str(built / "model"))
    model = AutoModelForCausalLM.from_pretrained(str(built / "model")).eval()
    cfg = model.config
    assert cfg.hidden_size // cfg.num_attention_heads == 64 and cfg.tie_word_embeddings
    assert cfg.vocab_size == len(tok) and model.dtype == torch.float32
    ids = tok(TEXTS[0], return_tensors="pt", add_special_tokens=False)["input_ids"]
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > ids.shape[1]
    # Deterministic from the seed; a different seed gives different weights.
    build_tiny_causal_lm(tmp_path / "again", built / "tok", seed=3)
    build_tiny_causal_lm(tmp_path / "other", built / "tok", seed=4)
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "again"))
    other = AutoModelForCausalLM.from_pretrained(str(tmp_path / "other"))
    w = model.model.embed_tokens.weight
    assert torch.equal(w, again.model.embed_tokens.weight)
    assert not torch.equal(w, other.model.embed_tokens.weight)


def test_ensure_tiny_models_is_idempotent(tmp_path):
    from peer_rl.supervised.tiny_models import ensure_tiny_models

    paths = ensure_tiny_models(tmp_path)
    stamp = {k: (tmp_path / k / "model.safetensors").stat().st_mtime_ns for k in paths}
    assert ensure_tiny_models(tmp_path) == paths
    assert stamp == {k: (tmp_path / k / "model.safetensors").stat().st_mtime_ns for k in paths}
    assert (tmp_path / "judge" / "judge_template.json").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_tiny_vision_language_model_sees_the_image(built, tmp_path, family):
    """The processor expands a 64 x 64 frame into 4 image tokens; the model's output depends
    on the pixels (a different face changes the next-token distribution)."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from peer_rl.data.bundled import sample_root
    from peer_rl.supervised.tiny_models import build_tiny_vl

    build_tiny_vl(tmp_path / family, built / "tok", family=family, seed=5)
    proc = AutoProcessor.from_pretrained(str(tmp_path / family))
    model = AutoModelForImageTextToText.from_pretrained(str(tmp_path / family)).eval()
    assert model.config.model_type == family
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How?"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    faces = sample_root() / "grpo" / "images"
    logits = []
    for name in ("face_sad_1.png", "face_happy_1.png"):
        inputs = proc(text=[text], images=[Image.open(faces / name).convert("RGB")],
                      return_tensors="pt")
        assert int((inputs["input_ids"] == model.config.image_token_id).sum()) == 4
        with torch.no_grad():
            logits.append(model(**inputs).logits[0, -1])
    assert (logits[0] - logits[1]).abs().max() > 1e-4
