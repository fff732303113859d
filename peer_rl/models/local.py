"""Local model directories: checked whole before any pool starts, and found on every node.

A directory that has `config.json` but lost its weights (a copy or an upload that left
`*.safetensors` out, a fetch cut short) would otherwise reach transformers or vLLM inside a
worker and end in a traceback about missing files minutes into start-up.
"""
from __future__ import annotations

import json
from pathlib import Path

from peer_rl.errors import ConfigError
from peer_rl.models.pinned import ensure_model

BUNDLED = Path(__file__).resolve().parents[1] / "bundled"

# the weight files transformers and vLLM load: one file, or shards listed by an index
_SINGLE = ("model.safetensors", "pytorch_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")

LIKELY_CAUSE = ("likely left out when the directory was copied or uploaded (a `ray job submit` "
                "runtime env whose `excludes` match '*.safetensors' drops them from the working "
                "dir), or a download or fetch that did not finish")


def missing_weights(model_dir: Path) -> str:
    """Why `model_dir` holds no loadable weights, or "" when it does."""
    if any((model_dir / name).is_file() for name in _SINGLE):
        return ""
    for name in _INDEXES:
        index = model_dir / name
        if index.is_file():
            try:
                shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                return f"{name} is not a weight index ({exc!r})"
            gone = sorted(s for s in shards if not (model_dir / s).is_file())
            if gone:
                return (f"{name} names {len(shards)} shard file(s), {len(gone)} missing "
                        f"({', '.join(gone[:3])}{', ...' if len(gone) > 3 else ''})")
            return ""
    if any(model_dir.glob("*.safetensors")):
        return ""
    return (f"config.json but no weights (expected {' or '.join(_SINGLE)}, or shards with "
            f"{' / '.join(_INDEXES)})")


def check_model_dir(label: str, path: str, *, error: type[Exception] = ConfigError,
                    example: str = "") -> str:
    """`path` (a pinned model fetched first) when it is a whole Hugging Face model directory;
    otherwise `error` in one line: `label` (the key or flag and its value), what is missing and
    the likely cause."""
    model_dir = Path(ensure_model(path))
    if not (model_dir / "config.json").is_file():
        raise error(f"{label}: no config.json there (expected a Hugging Face model directory"
                    + (f", e.g. {example}" if example else "") + ")")
    why = missing_weights(model_dir)
    if why:
        raise error(f"{label}: {why}; {LIKELY_CAUSE}")
    return path


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def check_adapter_dir(label: str, path: str, *, also: tuple[str, ...] = (),
                      error: type[Exception] = ConfigError) -> str:
    """`path` when it is a LoRA adapter in PEFT's format (and holds the files in `also`);
    otherwise `error` in one line naming `label` and what is missing."""
    missing = [f for f in (*ADAPTER_FILES, *also) if not (Path(path) / f).is_file()]
    if missing:
        raise error(f"{label}: no {', '.join(missing)} there (expected a LoRA adapter "
                    "directory in PEFT's format, e.g. the final/adapter of `peer-rl train-rm "
                    "model.lora.rank=R`)")
    return path


def on_this_node(path: str) -> str:
    """A path into peer-rl's bundled files as the driver saw them, mapped to this process's own
    copy. A job's working dir is unpacked under a different directory on every node (Ray's
    session dir), so the driver's path to a shipped model names nothing on another machine;
    paths outside the bundled tree, and paths that exist here, are returned unchanged."""
    given = Path(path)
    if given.exists():
        return path
    parts = given.parts
    for i in range(len(parts) - 1, 0, -1):
        if parts[i - 1:i + 1] == ("peer_rl", "bundled"):
            local = BUNDLED.joinpath(*parts[i + 1:])
            return str(local) if local.exists() else path
    return path
