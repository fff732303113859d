"""GGUF -> float32 HF directory, on a tiny random Llama written as GGUF in the test."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gguf_writer import tiny_llama, tiny_tokenizer, write_gguf
from peer_rl.models.gguf import GGUFError, convert_gguf, converted

IDS = torch.tensor([[5, 17, 30, 99, 4, 8, 250, 3]])


@pytest.fixture(scope="module")
def tiny():
    tok = tiny_tokenizer()
    return tok, tiny_llama(tok.get_vocab_size())


def _logits(path, **kw):
    model = AutoModelForCausalLM.from_pretrained(str(path), **kw).eval()
    with torch.no_grad():
        return model(IDS).logits


def test_float_gguf_converts_to_the_model_it_was_written_from(tiny, tmp_path):
    """F32 tensors: the converted directory is the original model, so the Q/K row order and every
    tensor name were mapped back right."""
    tok, model = tiny
    out = convert_gguf(write_gguf(tmp_path / "m.gguf", model, tok, quant="F32"), tmp_path / "hf")
    with torch.no_grad():
        expected = model(IDS).logits
    assert torch.equal(_logits(out), expected)
    assert converted(out)
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["dtype"] == "float32"
    assert cfg["tie_word_embeddings"] is True and cfg["num_key_value_heads"] == 1


def test_quantized_gguf_matches_transformers_own_gguf_load(tiny, tmp_path):
    """Q4_1 (the pinned SmolLM2 file's type): the converted model gives the logits transformers'
    GGUF loader gives, and they differ from the unquantized original (the weights really are
    the dequantized 4-bit ones)."""
    tok, model = tiny
    gguf = write_gguf(tmp_path / "m.gguf", model, tok, quant="Q4_1")
    out = convert_gguf(gguf, tmp_path / "hf")
    via_gguf = _logits(tmp_path, gguf_file=gguf.name)
    assert torch.equal(_logits(out), via_gguf)
    with torch.no_grad():
        original = model(IDS).logits
    gap = (via_gguf - original).abs().max().item()
    assert 1e-4 < gap < 1.0


def test_tokenizer_and_chat_template_survive(tiny, tmp_path):
    tok, model = tiny
    out = convert_gguf(write_gguf(tmp_path / "m.gguf", model, tok, quant="F32"), tmp_path / "hf")
    hf = AutoTokenizer.from_pretrained(str(out))
    text = "I lost my job today and I feel like a failure."
    assert hf(text, add_special_tokens=False).input_ids == tok.encode(text).ids
    chat = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                  add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert hf.eos_token == "<|im_end|>" and hf.pad_token == "<|im_end|>"


def test_a_gguf_without_chat_template_is_refused_and_leaves_nothing(tiny, tmp_path):
    tok, model = tiny
    gguf = write_gguf(tmp_path / "m.gguf", model, tok, quant="F32", chat_template=None)
    with pytest.raises(GGUFError, match="chat_template"):
        convert_gguf(gguf, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]


def test_not_a_gguf_names_the_file(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(GGUFError, match="x.gguf"):
        convert_gguf(bad, tmp_path / "hf")
    with pytest.raises(GGUFError, match="no such GGUF"):
        convert_gguf(tmp_path / "absent.gguf", tmp_path / "hf")
