"""Image inputs of a vision-language forward pass, made exactly as vLLM made them at rollout.

vLLM expands each image of a prompt into `grid_t * grid_h * grid_w / merge_size**2` image-pad
tokens with the checkpoint's own processor, and the token ids it returns already hold that
expansion. The trainer re-creates the same pixel values and grid sizes with the same processor
(loaded from the same directory), and marks image tokens in `mm_token_type_ids`, from which the
model computes its multimodal (M-RoPE) position ids as it did for the engine. Token counts are
checked per row, so a row whose ids and images disagree fails loudly instead of training on a
distribution the engine never sampled.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from peer_rl.prompts.multimodal import open_image


class VisionInputs:
    """Pixel values, grid sizes and image-token types for rows of token ids + image paths."""

    def __init__(self, model_path: str, cache_size: int = 4096):
        from transformers import AutoProcessor  # deferred: transformers (~3 s, pulls in torch)

        cfg = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
        self.image_token_id = cfg.get("image_token_id")
        if self.image_token_id is None:
            raise ValueError(f"{model_path}: config.json has no image_token_id; not a "
                             "Qwen-VL-style checkpoint")
        self.image_processor = AutoProcessor.from_pretrained(model_path).image_processor
        self.merge = int(getattr(self.image_processor, "merge_size", 2))
        self.cache_size = cache_size
        self._cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.seconds = 0.0           # spent processing images (cache misses), for timing metrics

    def _one(self, path: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel patches, grid_thw (3,)) of one image file; cached by path."""
        hit = self._cache.get(path)
        if hit is not None:
            return hit

        t0 = time.perf_counter()
        out = self.image_processor(images=[open_image(path)], return_tensors="pt")
        value = (out["pixel_values"], out["image_grid_thw"][0])
        self.seconds += time.perf_counter() - t0
        if len(self._cache) >= self.cache_size:
            self._cache.pop(next(iter(self._cache)))
        self._cache[path] = value
        return value

    def tokens(self, path: str) -> int:
        """Image tokens one image expands into: grid_t * grid_h * grid_w / merge_size**2."""
        return int(self._one(path)[1].prod()) // self.merge ** 2

    def __call__(self, input_ids: torch.Tensor, images: list[list[str]]) -> dict:
        """Model kwargs for rows `input_ids` (B, T) whose images are `images` (B lists).

        Returns {} when no row has an image (a text-only forward)."""
        if len(images) != len(input_ids):
            raise ValueError(f"{len(images)} image lists for {len(input_ids)} rows")
        pixels, grids = [], []
        for r, paths in enumerate(images):
            row_grids = [self._one(p) for p in paths]
            expected = sum(int(g.prod()) // self.merge ** 2 for _, g in row_grids)
            found = int((input_ids[r] == self.image_token_id).sum())
            if found != expected:
                raise ValueError(f"row {r}: {found} image token(s) in the ids but its "
                                 f"{len(paths)} image(s) expand to {expected}; the ids were not "
                                 "made by this checkpoint's processor from these images")
            for px, g in row_grids:
                pixels.append(px)
                grids.append(g)
        if not pixels:
            return {}
        return {"pixel_values": torch.cat(pixels), "image_grid_thw": torch.stack(grids),
                "mm_token_type_ids": (input_ids == self.image_token_id).int()}
