"""The trained tiny judge and policy shipped inside peer-rl: served only while they were
trained on exactly what this code would train them on."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from peer_rl.trainer import tiny_cache
from peer_rl.trainer.tiny_cache import (MANIFEST, SHIPPED_DIR, STAGES, ensure_trained_tiny_models,
                                        inputs_sha256, read_manifest, shipped_model, stage_inputs)


@pytest.fixture(scope="module")
def current_inputs(tiny_models) -> dict[str, dict[str, str]]:
    cache = Path(tiny_models["policy"]).parent
    return {name: stage_inputs(cache, kind) for name, kind in STAGES}


@pytest.fixture
def known_inputs(current_inputs, monkeypatch) -> None:
    """stage_inputs answers with the module's current inputs: a copy of the cache holds the same
    bytes, so it has the same digests (the paths are left out:
    test_the_inputs_are_the_same_wherever_the_random_models_are_built), and working them out
    again renders every training row through the tokenizer (seconds a stage)."""
    by_kind = {kind: current_inputs[name] for name, kind in STAGES}
    monkeypatch.setattr(tiny_cache, "stage_inputs", lambda cache_dir, kind: by_kind[kind])


def test_the_shipped_models_were_trained_on_what_this_code_would_train_them_on(current_inputs):
    """Fails when a recipe, the bundled data, a template or the example rendering changes
    without the shipped models being rebuilt: `peer-rl models build-tiny`, then commit."""
    manifest = read_manifest()
    for name, kind in STAGES:
        entry = manifest["models"][name]
        assert entry["kind"] == kind
        assert entry["inputs"] == current_inputs[name], (
            f"the shipped tiny {name} is stale: rebuild with `peer-rl models build-tiny`")
        assert entry["inputs_sha256"] == inputs_sha256(current_inputs[name])
        assert (SHIPPED_DIR / name / "model.safetensors").stat().st_size < 8 * 2**20


def test_the_inputs_are_the_same_wherever_the_random_models_are_built(current_inputs, tmp_path):
    """The digests leave paths out: a second cache directory (random models rebuilt there from
    the same seeds) gives the same inputs, so every machine agrees with the manifest."""
    assert stage_inputs(tmp_path, "sft") == current_inputs["policy"]


@pytest.mark.parametrize("changed", ["config", "start_model", "data", "examples"])
def test_a_model_trained_on_other_inputs_is_not_served(current_inputs, changed):
    inputs = dict(current_inputs["judge"], **{changed: "0" * 64})
    path, why = shipped_model("judge", inputs)
    assert path is None
    assert f"({changed} differ" in why and "peer-rl models build-tiny" in why
    path, why = shipped_model("judge", current_inputs["judge"])
    assert path == str(SHIPPED_DIR / "judge") and why == ""


def test_no_shipped_copy_is_said_so(current_inputs, tmp_path):
    path, why = shipped_model("policy", current_inputs["policy"], shipped_dir=tmp_path)
    assert path is None and str(tmp_path) in why
    shutil.copytree(SHIPPED_DIR, tmp_path / "tiny")
    (tmp_path / "tiny" / "policy" / "config.json").unlink()     # a half-copied model
    path, why = shipped_model("policy", current_inputs["policy"], shipped_dir=tmp_path / "tiny")
    assert path is None


def test_a_first_run_takes_the_shipped_models_and_trains_nothing(tiny_models, known_inputs,
                                                                 tmp_path, capsys, monkeypatch):
    def refuse(cfg, kind):
        raise AssertionError(f"trained the tiny {kind} model instead of taking the shipped one")

    monkeypatch.setattr(tiny_cache, "run_supervised", refuse)
    cache = tmp_path / "cache"
    shutil.copytree(Path(tiny_models["policy"]).parent, cache)
    got = ensure_trained_tiny_models(cache)
    assert got == {"judge": str(SHIPPED_DIR / "judge"), "policy": str(SHIPPED_DIR / "policy")}
    assert not (cache / "trained").exists()
    assert "shipped with peer-rl" in capsys.readouterr().out


def test_the_inputs_are_worked_out_once_per_version_of_the_code(tiny_models, tmp_path,
                                                                monkeypatch):
    cache = tmp_path / "cache"
    shutil.copytree(Path(tiny_models["policy"]).parent, cache)
    first = tiny_cache.remembered_stage_inputs(cache, "sft")
    monkeypatch.setattr(tiny_cache, "stage_inputs", lambda *a: pytest.fail("worked out again"))
    assert tiny_cache.remembered_stage_inputs(cache, "sft") == first
    # another version of the code (or data, or recipes) is another key: worked out afresh
    monkeypatch.setattr(tiny_cache, "_code_and_data_key", lambda kind: "f" * 64)
    monkeypatch.setattr(tiny_cache, "stage_inputs", lambda *a: {"config": "new"})
    assert tiny_cache.remembered_stage_inputs(cache, "sft") == {"config": "new"}


def test_the_code_key_follows_the_code_and_the_data(monkeypatch, tmp_path):
    from peer_rl import recipes

    key = tiny_cache._code_and_data_key("rm")
    assert tiny_cache._code_and_data_key("sft") != key
    extra = Path(recipes.__file__).parent / "zz_probe_recipe.yaml"
    try:
        extra.write_text("experiment_name: probe\n")
        assert tiny_cache._code_and_data_key("rm") != key
    finally:
        extra.unlink()
    assert tiny_cache._code_and_data_key("rm") == key


def test_stale_shipped_models_send_the_run_to_training_in_the_cache(tiny_models, current_inputs,
                                                                     known_inputs, tmp_path,
                                                                     monkeypatch, capsys):
    """A manifest that disagrees makes the run train the model into a directory named by the
    current inputs' digest; a model already trained there is reused, not retrained."""
    cache = Path(tiny_models["policy"]).parent
    stale = tmp_path / "shipped"
    shutil.copytree(SHIPPED_DIR, stale)
    manifest = json.loads((stale / MANIFEST).read_text())
    manifest["models"]["judge"]["inputs"]["data"] = "0" * 64
    (stale / MANIFEST).write_text(json.dumps(manifest))
    monkeypatch.setattr(tiny_cache, "SHIPPED_DIR", stale)
    trained = []
    monkeypatch.setattr(tiny_cache, "run_supervised", lambda cfg, kind: trained.append(
        (kind, cfg.trainer.output_dir)))
    work = tmp_path / "cache"
    shutil.copytree(cache, work)
    got = ensure_trained_tiny_models(work)
    run_dir = work / "trained" / f"judge-{inputs_sha256(current_inputs['judge'])[:12]}"
    assert trained == [("rm", str(run_dir))]            # only the judge, into its digest's dir
    assert got == {"judge": str(run_dir / "final"), "policy": str(stale / "policy")}
    assert "data differ" in capsys.readouterr().out
    (run_dir / "final").mkdir(parents=True)
    (run_dir / "final" / "config.json").write_text("{}")
    trained.clear()
    ensure_trained_tiny_models(work)
    assert trained == []


def test_a_damaged_manifest_is_named_with_the_way_back(tmp_path):
    (tmp_path / MANIFEST).write_text('{"models": {"judge": {"kind": "rm"')
    with pytest.raises(ValueError, match="manifest.json: not a manifest.*build-tiny"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text('{"models": {"judge": {"kind": "rm"}}}')   # no inputs
    with pytest.raises(ValueError, match="not a manifest"):
        read_manifest(tmp_path)


def test_a_damaged_or_missing_shipped_file_is_named_with_the_way_back(tmp_path):
    """The manifest lists every shipped file's sha256 (computed here by hand with hashlib): a
    flipped byte in the weights or a lost tokenizer stops the lookup with the file named, not
    deep inside the loader."""
    import hashlib

    shutil.copytree(SHIPPED_DIR, tmp_path / "tiny")
    entry = read_manifest(tmp_path / "tiny")["models"]["policy"]
    weights = tmp_path / "tiny" / "policy" / "model.safetensors"
    assert entry["files"]["model.safetensors"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert shipped_model("policy", entry["inputs"], tmp_path / "tiny")[0] is not None
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    (tmp_path / "tiny" / "policy" / "tokenizer.json").unlink()
    with pytest.raises(ValueError) as err:
        shipped_model("policy", entry["inputs"], tmp_path / "tiny")
    msg = str(err.value)
    assert "model.safetensors (differs)" in msg and "tokenizer.json (missing)" in msg
    assert "reinstall peer-rl" in msg and "peer-rl models build-tiny" in msg
