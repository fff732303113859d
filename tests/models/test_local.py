"""peer_rl.models.local: a model directory without its weights is refused in one line before
any pool starts, and a path into the driver's copy of the bundled models is found on a node
that unpacked its own copy elsewhere."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from peer_rl.errors import ConfigError
from peer_rl.models.local import BUNDLED, check_model_dir, missing_weights, on_this_node
from peer_rl.trainer.tiny_cache import SHIPPED_DIR


def _model(tmp_path: Path, *weights: str, index: dict | None = None) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    for name in weights:
        (d / name).write_bytes(b"\0" * 8)
    if index is not None:
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d


@pytest.mark.parametrize("weights", [("model.safetensors",), ("pytorch_model.bin",),
                                     ("model-00001-of-00001.safetensors",)])
def test_a_directory_with_its_weights_passes(tmp_path, weights):
    d = _model(tmp_path, *weights)
    assert missing_weights(d) == ""
    assert check_model_dir(f"model.path={str(d)!r}", str(d)) == str(d)


def test_sharded_weights_pass_only_with_every_shard_the_index_names(tmp_path):
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}}
    d = _model(tmp_path, "model-00001-of-00002.safetensors", index=index)
    assert missing_weights(d) == ("model.safetensors.index.json names 2 shard file(s), 1 missing "
                                  "(model-00002-of-00002.safetensors)")
    (d / "model-00002-of-00002.safetensors").write_bytes(b"\0")
    assert missing_weights(d) == ""


def test_a_directory_without_weights_is_refused_in_one_line_naming_key_path_and_cause(tmp_path):
    d = _model(tmp_path)            # config.json, tokenizer and the rest, but no weights
    (d / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError) as err:
        check_model_dir(f"model.path={str(d)!r}", str(d))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"model.path={str(d)!r}: config.json but no weights")
    assert "excludes" in msg and "*.safetensors" in msg and "did not finish" in msg


def test_no_config_names_the_example_and_raises_the_callers_error(tmp_path):
    class Refused(ValueError):
        pass

    with pytest.raises(Refused, match=r"^--model /x: no config.json there \(expected a Hugging "
                                      r"Face model directory, e.g. outputs/run/final\)$"):
        check_model_dir("--model /x", str(tmp_path / "x"), error=Refused,
                        example="outputs/run/final")


def test_the_shipped_tiny_models_are_whole():
    for name in ("policy", "judge"):
        assert missing_weights(SHIPPED_DIR / name) == "", name


def test_a_driver_path_into_the_bundled_tree_is_found_in_this_nodes_copy(tmp_path):
    """On another node the job's working dir is unpacked under another session directory: the
    driver's path names nothing there, the same relative path in this copy does."""
    driver = (tmp_path / "session_a" / "runtime_resources" / "working_dir_files" / "_ray_pkg_1"
              / "peer_rl" / "bundled" / "models" / "tiny" / "policy")
    assert not driver.exists()
    assert on_this_node(str(driver)) == str(BUNDLED / "models" / "tiny" / "policy")
    assert Path(on_this_node(str(driver)), "model.safetensors").is_file()


def test_paths_that_exist_or_lie_outside_the_bundled_tree_are_kept(tmp_path):
    here = tmp_path / "peer_rl" / "bundled" / "models" / "tiny" / "policy"
    here.mkdir(parents=True)
    assert on_this_node(str(here)) == str(here)          # a copy that exists here wins
    shutil.rmtree(here)
    elsewhere = tmp_path / "ckpt" / "policy"
    assert on_this_node(str(elsewhere)) == str(elsewhere)
    unknown = tmp_path / "peer_rl" / "bundled" / "models" / "no-such-model"
    assert on_this_node(str(unknown)) == str(unknown)    # not in this copy either: unchanged


def test_train_refuses_a_policy_without_weights_before_any_pool_starts(tmp_path, capsys):
    """The shipped tiny policy copied as an upload excluding '*.safetensors' would leave it."""
    from peer_rl.cli import main

    policy = tmp_path / "policy"
    shutil.copytree(SHIPPED_DIR / "policy", policy,
                    ignore=shutil.ignore_patterns("*.safetensors"))
    assert main(["train", f"model.path={policy}", f"reward_model.path={SHIPPED_DIR / 'judge'}",
                 f"trainer.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: model.path={str(policy)!r}: config.json but no weights (expected "
                   "model.safetensors or pytorch_model.bin, or shards with "
                   "model.safetensors.index.json / pytorch_model.bin.index.json); likely left "
                   "out when the directory was copied or uploaded (a `ray job submit` runtime "
                   "env whose `excludes` match '*.safetensors' drops them from the working "
                   "dir), or a download or fetch that did not finish"], err
