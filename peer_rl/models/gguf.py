"""A GGUF checkpoint as a plain float32 Hugging Face directory that vLLM, FSDP and
`save_pretrained` all take.

transformers reads GGUF (dequantizing every tensor) but marks the model it returns with a
`quantization_config`, and refuses to save it. The dequantized weights are ordinary tensors, so a
fresh model built from the same config without that key takes them with every key matched.
"""
from __future__ import annotations

import json
from pathlib import Path

from peer_rl.files.out_paths import staged_dir

# what a converted directory holds; a directory missing any of them is not finished
CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                   "generation_config.json")


class GGUFError(ValueError):
    """A GGUF file that cannot become an HF directory, with the file named."""


def converted(path: str | Path) -> bool:
    return all((Path(path) / f).exists() for f in CONVERTED_FILES)


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32",
                 provenance: dict | None = None) -> Path:
    """Write `out_dir` (weights, config, tokenizer with its chat template, generation config).
    Written to a temp directory beside it and renamed into place, so an interrupted conversion
    never leaves a directory that looks complete."""
    import torch  # deferred: torch (~2 s); the CLI starts without it
    # deferred: transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf_path, out_dir = Path(gguf_path).resolve(), Path(out_dir)
    if not gguf_path.is_file():
        raise GGUFError(f"{gguf_path}: no such GGUF file")
    torch_dtype = getattr(torch, dtype)
    directory, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch_dtype)
    except (ValueError, KeyError, OSError) as exc:
        raise GGUFError(f"{gguf_path}: transformers cannot read it as a GGUF causal LM: "
                        f"{exc}") from exc
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch_dtype
    plain = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # a tied lm_head is absent from the state dict by design
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise GGUFError(f"{gguf_path}: converted weights do not match the architecture "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    if config.tie_word_embeddings:
        plain.tie_weights()
    plain.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id)

    with staged_dir(out_dir) as tmp:     # on disk before the card marks it fetched
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if not tokenizer.chat_template:
            raise GGUFError(f"{gguf_path}: no tokenizer.chat_template in its metadata; the "
                            "policy and judge prompts need one")
        info = {"source": str(gguf_path), "dtype": dtype, **(provenance or {})}
        (tmp / "converted_from.json").write_text(json.dumps(info, indent=2) + "\n")
    return out_dir
