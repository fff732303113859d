"""TrainLoopConfig: what every rank of a supervised stage is given (no Ray, no model)."""
import dataclasses
import pickle

import pytest

from peer_rl.config.worker_settings import LoRASettings
from peer_rl.supervised.config import TrainLoopConfig


def fields(**over) -> dict:
    base = dict(kind="rm", train_files=("ser/*/*_train.jsonl",), skip_invalid=False, max_rows=0,
                max_length=2048, languages=(), batch_size=8, micro_batch_size=1, total_steps=150,
                lr=2e-3, lr_scheduler="cosine", warmup_steps=10, min_lr_ratio=0.1,
                weight_decay=0.0, grad_clip=1.0, save_freq=75, log_freq=25, seed=0,
                dtype="float32", gradient_checkpointing=False, freeze_vision_tower=True,
                extra_files={"judge_template.json": "{}"}, verdict_balance=False,
                lora=LoRASettings(), model_path="/models/judge", data_root="/data",
                output_dir="/runs/rm", verbose=False, cpus_per_worker=1.0, use_gpu=False)
    return base | over


def test_a_misspelt_or_missing_field_fails_where_the_config_is_built():
    with pytest.raises(TypeError, match="lerning_rate"):
        TrainLoopConfig(**fields(lerning_rate=1e-3))
    without_seed = fields()
    del without_seed["seed"]
    with pytest.raises(TypeError, match="seed"):
        TrainLoopConfig(**without_seed)
    config = TrainLoopConfig(**fields())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr = 1.0
    with pytest.raises(AttributeError):
        config.learning_rate        # noqa: B018  the loop reads attributes, not .get(key, default)


def test_it_travels_to_the_workers_as_plain_data():
    config = TrainLoopConfig(**fields(lora=LoRASettings(rank=8)))
    back = pickle.loads(pickle.dumps(config))
    assert back == config and back.lora.rank == 8 and back is not config


def test_the_training_inputs_leave_out_where_it_runs_and_the_settings_left_off():
    """The digest of what a stage learns (the shipped models' manifests): paths, verbosity and
    the machine are not in it, nor verdict_balance and lora while off (the digests of the stages
    made before those keys existed stay as they were)."""
    inputs = TrainLoopConfig(**fields()).training_inputs()
    assert inputs == {
        "kind": "rm", "train_files": ("ser/*/*_train.jsonl",), "skip_invalid": False,
        "max_rows": 0, "max_length": 2048, "languages": (), "batch_size": 8,
        "micro_batch_size": 1, "total_steps": 150, "lr": 2e-3, "lr_scheduler": "cosine",
        "warmup_steps": 10, "min_lr_ratio": 0.1, "weight_decay": 0.0, "grad_clip": 1.0,
        "save_freq": 75, "log_freq": 25, "seed": 0, "dtype": "float32",
        "gradient_checkpointing": False, "freeze_vision_tower": True,
        "extra_files": {"judge_template.json": "{}"}}
    on = TrainLoopConfig(**fields(verdict_balance=True, lora=LoRASettings(
        rank=8, lora_alpha=32.0, target_modules=["q_proj"], merge="true"))).training_inputs()
    # lora as it always was digested: four keys, not the GRPO engines' merge
    assert on == inputs | {"verdict_balance": True, "lora": {
        "rank": 8, "lora_alpha": 32.0, "target_modules": ["q_proj"], "lora_adapter_path": ""}}


@pytest.mark.parametrize("override, allowed", [
    ("trainer.lr_scheduler=linear", "['constant', 'cosine']"),
    ("resume=maybe", "['auto', 'disable']"),
    ("judge.template_check=loud", "['strict', 'warn', 'off']"),
    ("trainer.dtype=fp16", "['auto', 'float32', 'bfloat16']"),
])
def test_a_closed_choice_of_the_supervised_stages_is_refused_naming_key_and_choices(override,
                                                                                    allowed):
    from peer_rl.config.schema import ConfigError
    from peer_rl.supervised.config import load_supervised_config

    key, value = override.split("=")
    with pytest.raises(ConfigError) as err:
        load_supervised_config([override], "rm")
    assert str(err.value) == (f"config key '{key}': Invalid value '{value}', "
                              f"expected one of {allowed}")
