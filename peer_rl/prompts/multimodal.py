"""Where images go in a chat, for every engine that reads one (rollout, judge, trainers).

Rows carry `messages` (text) and `images` (paths). Datasets in the ms-swift / LLaMA-Factory
style mark each image's place with an `<image>` tag in the text; the PEER card does not say, so
both are accepted: with tags, each tag becomes one image part in place (the count must match);
without tags, the images go before the text of one chosen turn (the policy prompt: the last user
turn; the judge: the round that judges Step 2). Parts are OpenAI-style
(`{"type": "image", "image": path}`, `{"type": "text", "text": ...}`), which chat templates of
the Qwen-VL families render and vLLM's chat entry point accepts once the image is loaded.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

IMAGE_TAG = "<image>"
_TAG = re.compile(re.escape(IMAGE_TAG))


def count_tags(messages: list[dict]) -> int:
    return sum(len(_TAG.findall(m["content"])) for m in messages if isinstance(m["content"], str))


def strip_tags(messages: list[dict]) -> list[dict]:
    """The chat without image tags (a text-only model reads the words alone)."""
    return [{**m, "content": _TAG.sub("", m["content"]).strip()}
            if isinstance(m["content"], str) and IMAGE_TAG in m["content"] else m
            for m in messages]


def _parts(text: str, images: list[str]) -> list[dict]:
    """Text with `<image>` tags -> parts, consuming `images` in order."""
    parts: list[dict] = []
    pieces = _TAG.split(text)
    for i, piece in enumerate(pieces):
        if i > 0:
            parts.append({"type": "image", "image": images.pop(0)})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def attach_images(messages: list[dict], images: list[str], turn: int | None = None) -> list[dict]:
    """messages with `images` placed as image parts (see the module docstring).

    turn: index of the message that receives untagged images (default: the last user turn).
    A tag count different from the number of images raises, naming both.
    """
    if not images:
        return strip_tags(messages)
    tags = count_tags(messages)
    if tags and tags != len(images):
        raise ValueError(f"the chat has {tags} {IMAGE_TAG} tag(s) for {len(images)} image(s)")
    queue = list(images)
    out = []
    if tags:
        for m in messages:
            if isinstance(m["content"], str) and IMAGE_TAG in m["content"]:
                out.append({**m, "content": _parts(m["content"], queue)})
            else:
                out.append(m)
        return out
    if turn is None:
        turn = max(i for i, m in enumerate(messages) if m["role"] == "user")
    for i, m in enumerate(messages):
        if i == turn:
            text = [{"type": "text", "text": m["content"]}] if m["content"] else []
            out.append({**m, "content": [{"type": "image", "image": p} for p in queue] + text})
        else:
            out.append(m)
    return out


def image_paths(messages: list[dict]) -> list[str]:
    """The image parts of a chat, in order."""
    return [p["image"] for m in messages if isinstance(m["content"], list)
            for p in m["content"] if p.get("type") == "image"]


def for_vllm(messages: list[dict]) -> list[dict]:
    """Image parts as loaded PIL images (`image_pil`), which vLLM's `LLM.chat` takes directly."""
    out = []
    for m in messages:
        if not isinstance(m["content"], list):
            out.append(m)
            continue
        parts = []
        for p in m["content"]:
            if p.get("type") == "image":
                parts.append({"type": "image_pil", "image_pil": open_image(p["image"])})
            else:
                parts.append(p)
        out.append({**m, "content": parts})
    return out


def is_vision_language(model_path: str) -> bool:
    """A checkpoint with a vision encoder: its config.json has a `vision_config`."""
    path = Path(model_path) / "config.json"
    return path.exists() and "vision_config" in json.loads(path.read_text(encoding="utf-8"))


# images a dataset may hold: the formats Pillow decodes in Python (EPS would run Ghostscript),
# and a pixel cap far above any frame the models take (a decompression bomb stops here)
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP")
MAX_IMAGE_PIXELS = 40_000_000


class ImageRefused(ValueError):
    pass


def open_image(path):
    """A dataset image as RGB: PNG, JPEG or WebP only, at most MAX_IMAGE_PIXELS pixels."""
    from PIL import Image, UnidentifiedImageError  # deferred: Pillow (only images need it)

    try:
        im = Image.open(path, formats=IMAGE_FORMATS)
    except UnidentifiedImageError:
        raise ImageRefused(f"{path}: not a {'/'.join(IMAGE_FORMATS)} image") from None
    with im:
        w, h = im.size
        if w * h > MAX_IMAGE_PIXELS:
            raise ImageRefused(f"{path}: {w}x{h} pixels, over the {MAX_IMAGE_PIXELS:,} cap")
        return im.convert("RGB")
