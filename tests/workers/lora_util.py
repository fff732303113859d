"""A saved PEFT adapter with random, non-zero A and B, for the tests that load one: a fresh
adapter's B is 0, which a rank or a loader that never received it could match by chance."""
from __future__ import annotations

from typing import Callable

import torch


def save_random_adapter(load_base: Callable[[], torch.nn.Module], directory, rank: int,
                        alpha: float) -> str:
    """An adapter of `rank` on every linear layer outside a vision tower (Qwen2.5-VL's
    `model.visual`) of the model `load_base` returns, seeded, saved to `directory`."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    base = load_base()
    tower = r"model\.visual(\..*)?" if hasattr(base.model, "visual") else None
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear",
                                            exclude_modules=tower))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(directory)
    return str(directory)
