import os
import subprocess
import sys
from pathlib import Path

import pytest

from peer_rl.config.schema import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


def test_default_is_tiny_peer_rur():
    cfg = load_config([])
    assert cfg.recipe == "tiny" and cfg.algorithm.rur.enable and cfg.rollout.n == 4
    assert cfg.trainer.output_dir == "outputs/tiny"


def test_recipes_by_name_with_overrides():
    cfg = load_config(["recipe=peer_rur", "rollout.num_workers=2", "trainer.total_steps=5"])
    assert (cfg.experiment_name, cfg.rollout.num_workers, cfg.trainer.total_steps) == ("peer_rur", 2, 5)
    assert cfg.algorithm.rur.enable and cfg.actor.lr == 1e-6 and cfg.data.train_batch_size == 24
    assert not load_config(["recipe=peer"]).algorithm.rur.enable


def test_a_recipe_or_its_base_rewritten_between_loads_is_read_again(tmp_path):
    """Loaded recipes are kept per version of their files (`plan` loads one per candidate fix);
    a rewrite of the same size, at once, is still seen, and a load's result is its own."""
    base, top = tmp_path / "base.yaml", tmp_path / "top.yaml"
    base.write_text("trainer:\n  total_steps: 3\n")
    top.write_text(f"base: {base}\nrollout:\n  n: 4\n")
    first = load_config([f"recipe={top}"])
    assert (first.trainer.total_steps, first.rollout.n) == (3, 4)
    base.write_text("trainer:\n  total_steps: 7\n")          # same size, same instant
    top.write_text(f"base: {base}\nrollout:\n  n: 6\n")
    second = load_config([f"recipe={top}", "actor.lr=0.5"])
    assert (second.trainer.total_steps, second.rollout.n, second.actor.lr) == (7, 6, 0.5)
    third = load_config([f"recipe={top}"])
    assert (third.trainer.total_steps, third.rollout.n, third.actor.lr) == (7, 6, first.actor.lr)
    assert (first.trainer.total_steps, first.rollout.n) == (3, 4)


@pytest.mark.parametrize("override,message", [
    ("rollout.nn=2", "config key 'rollout.nn'"),
    ("actor.lr=fast", "config key 'actor.lr'"),
    ("rollout.num_workers=-1", "rollout.num_workers=-1: expected a positive value"),
    ("actor.world_size=0", "actor.world_size=0: expected a positive value"),
    ("rollout.n=1", "rollout.n=1: GRPO needs at least 2"),
    # a Literal field: OmegaConf's own message, on the project's one line naming the key
    # a str field (verl's OmegaConf 2.3 reads RedundancySettings), checked against its choices
    ("algorithm.rur.history_agg=median", "algorithm.rur.history_agg='median': expected one of "
                                         "('max', 'mean')"),
    ("recipe=nope", "recipe='nope': no such recipe"),
    ("resume=/does/not/exist", "resume='/does/not/exist'"),
    ("actor.ppo_micro_batch_size=3", "must be a multiple of actor.ppo_micro_batch_size=3"),
    ("bogus", "expected key=value"),
    ("trainer.async_training.staleness=2", "config key 'trainer.async_training.staleness': "
                                           "Invalid value '2', expected one of [0, 1]"),
    ("actor.dtype=float16", "config key 'actor.dtype': Invalid value 'float16', expected one "
                            "of ['auto', 'float32', 'bfloat16']"),
    ("trainer.wandb.mode=cloud", "config key 'trainer.wandb.mode': Invalid value 'cloud'"),
    # a registry's key: checked against the names registered when the config is loaded
    ("algorithm.adv_estimator=gae", "algorithm.adv_estimator='gae': expected one of ('grpo', "
                                    "'rloo', 'reinforce_plus_plus_baseline')"),
    ("actor.loss_agg_mode=mean", "actor.loss_agg_mode='mean': expected one of"),
    ("trainer.async.staleness=1", "config key 'trainer.async'"),
    ("actor.behavior_weight_cap=-1", "actor.behavior_weight_cap=-1.0: expected a value >= 0"),
    ("actor.num_threads=-2", "actor.num_threads=-2: expected a value >= 0"),
    ("model.lora.rnak=8", "config key 'model.lora.rnak'"),
    ("model.lora.rank=-8", "model.lora.rank=-8: expected a value >= 0"),
    ("reward_model.weights.step=-0.5", "reward_model.weights.step=-0.5: expected a value >= 0"),
    ("reward_model.weights.fromat=1", "config key 'reward_model.weights.fromat'"),
    ("model.lora.target_modules=q_proj", "config key 'model.lora.target_modules'"),
    ("model.lora.merge=maybe", "model.lora.merge='maybe': expected one of ('auto', 'true', 'false')"),
])
def test_bad_config_fails_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=None) as err:
        load_config([override])
    assert message in str(err.value)


def test_config_is_read_only():
    cfg = load_config([])
    from omegaconf.errors import ReadonlyConfigError

    with pytest.raises(ReadonlyConfigError, match="Cannot change read-only config container"):
        cfg.rollout.n = 8
    assert cfg.rollout.n == 4


def test_a_text_only_policy_refuses_visual_rows_unless_told(tmp_path, capsys):
    import json as _json

    from peer_rl.config.schema import ConfigError as _ConfigError
    from peer_rl.trainer.run import check_modalities

    text_model, vl_model = tmp_path / "text", tmp_path / "vl"
    text_model.mkdir(), vl_model.mkdir()
    (text_model / "config.json").write_text(_json.dumps({"model_type": "qwen2"}))
    (vl_model / "config.json").write_text(_json.dumps({"model_type": "qwen2_vl",
                                                       "vision_config": {"depth": 2}}))
    rows = [{"images": []}, {"images": ["a.png", "b.png"]}]
    cfg = load_config([])
    with pytest.raises(_ConfigError, match=r"is a text-only model but 1 training prompt\(s\) "
                                           r"have images .*data.visual_rows_as_text=true"):
        check_modalities(cfg, rows, str(text_model))
    check_modalities(cfg, rows, str(vl_model))                         # a VL policy: fine
    check_modalities(cfg, rows[:1], str(text_model))                   # no visual rows: fine
    check_modalities(load_config(["data.visual_rows_as_text=true"]), rows, str(text_model))
    assert "1 visual prompt(s) are trained on their text" in capsys.readouterr().out


def test_prompts_per_file_is_checked_against_train_files():
    with pytest.raises(ConfigError, match=r"data.prompts_per_file=\[1, 2, 3\]: expected at most "
                                          r"one count >= 0 per entry of data.train_files \(2\)"):
        load_config(["data.prompts_per_file=[1,2,3]"])
    assert list(load_config(["recipe=peer_rur", "model.path=/m"]).data.prompts_per_file) == [2000, 1000]


def test_retrieval_needs_the_scalar_reward_model_and_escrag_recipe_loads():
    with pytest.raises(ConfigError, match="set reward_model.kind=scalar"):
        load_config(["retrieval.enable=true"])
    # a registry-backed key (peer_rl.config.reward_kinds): the registered kinds are named
    with pytest.raises(ConfigError, match=r"reward_model.kind='generative': expected one of "
                                          r"\('unifireward', 'scalar', 'prm_orm'\)"):
        load_config(["reward_model.kind=generative"])
    cfg = load_config(["recipe=escrag_r1_tiny"])
    assert cfg.retrieval.enable and cfg.retrieval.k == 3 and cfg.reward_model.kind == "scalar"


def test_in_training_safety_needs_a_judge_that_writes_with_the_scalar_reward_model():
    with pytest.raises(ConfigError, match="eval.safety_probes > 0 needs a judge that writes"):
        load_config(["recipe=escrag_r1_tiny", "trainer.eval_freq=2"])
    cfg = load_config(["recipe=escrag_r1_tiny", "trainer.eval_freq=2", "eval.safety_probes=0"])
    assert cfg.eval.diversity_prompts > 0
    load_config(["recipe=escrag_r1_tiny", "trainer.eval_freq=2", "eval.judge_url=http://h/v1"])


def test_a_tensor_parallel_engine_needs_its_gpus_in_its_bundle():
    with pytest.raises(ConfigError, match=r"rollout.tensor_model_parallel_size=2 shards each "
                                          r"engine over 2 GPUs, but resources.rollout."
                                          r"gpus_per_worker=1: set resources.rollout."
                                          r"gpus_per_worker=2"):
        load_config(["recipe=peer", "rollout.tensor_model_parallel_size=2"])
    cfg = load_config(["recipe=peer", "rollout.tensor_model_parallel_size=2",
                       "resources.rollout.gpus_per_worker=2"])
    assert cfg.rollout.enforce_eager is False          # CUDA graphs on GPU by default
    with pytest.raises(ConfigError, match="rollout.tensor_model_parallel_size=0: expected >= 1"):
        load_config(["rollout.tensor_model_parallel_size=0"])


@pytest.mark.parametrize("recipe", ["peer", "peer_rur", "escrag_r1"])
def test_the_paper_scale_recipes_read_batch_24_one_way(recipe):
    """24 prompts per rollout step and one optimizer step over all their 96 samples: not 24
    prompts rolled out and then 24-sequence mini-batches (4 updates, more off-policy)."""
    cfg = load_config([f"recipe={recipe}"])
    assert cfg.data.train_batch_size == 24 and cfg.rollout.n == 4
    assert cfg.actor.ppo_mini_batch_size == 24 and cfg.actor.ppo_epochs == 1
    assert cfg.data.train_batch_size // cfg.actor.ppo_mini_batch_size == 1


def test_a_new_run_into_a_directory_holding_another_is_refused(tmp_path, capsys):
    """Issue 24.3: resume=disable (the default) into another run's output_dir used to unlink its
    metrics and replace its same-step checkpoints; now nothing there is touched."""
    from peer_rl.cli import main

    run = tmp_path / "run"
    (run / "checkpoints" / "step_7").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 7}\n')
    assert main(["train", f"trainer.output_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run (metrics.jsonl, checkpoints)" in err and "resume=auto" in err
    assert (run / "metrics.jsonl").read_text() == '{"step": 7}\n'
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl"]


def _run_with_checkpoints(run, steps):
    """A run directory as training leaves it: its marker, metrics for steps 1..max, complete
    checkpoints."""
    import json

    run.mkdir()
    (run / ".peer-rl-out.json").write_text('{"command": "train"}')
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {k}}}\n'
                                               for k in range(1, max(steps) + 1)))
    for step in steps:
        d = run / "checkpoints" / f"step_{step}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text(json.dumps({"step": step}))
    return run


class _Started(Exception):
    """The run got past its output checks (the training itself is not wanted here)."""


def _refused_or_started(monkeypatch, capsys, argv):
    from peer_rl.cli import main

    def started(*a, **k):
        raise _Started

    monkeypatch.setattr("peer_rl.trainer.run._train", started)
    try:
        code = main(argv)
    except _Started:
        return "started", ""
    return code, capsys.readouterr().err.strip()


def test_resume_from_another_runs_checkpoint_only_into_a_fresh_directory(tmp_path, monkeypatch,
                                                                         capsys):
    """Issue 58.7: resume=PATH into another run's directory cut that run's metrics back to the
    checkpoint's step. Refused in one line, that run untouched; a new directory is a branch."""
    a = _run_with_checkpoints(tmp_path / "a", [2, 4])
    b = _run_with_checkpoints(tmp_path / "b", [6])
    before = (b / "metrics.jsonl").read_bytes()
    code, err = _refused_or_started(monkeypatch, capsys, [
        "train", f"trainer.output_dir={b}", f"resume={a}/checkpoints/step_4"])
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "a checkpoint of another run" in err and str(b) in err
    assert (b / "metrics.jsonl").read_bytes() == before
    assert sorted(p.name for p in b.iterdir()) == [".peer-rl-out.json", "checkpoints",
                                                   "metrics.jsonl"]
    assert _refused_or_started(monkeypatch, capsys, [
        "train", f"trainer.output_dir={tmp_path / 'branch'}",
        f"resume={a}/checkpoints/step_4"])[0] == "started"
    assert _refused_or_started(monkeypatch, capsys, [
        "train", f"trainer.output_dir={a}", f"resume={a}/checkpoints/step_4"])[0] == "started"


def test_resume_from_an_earlier_checkpoint_of_the_run_is_refused_while_later_ones_exist(
        tmp_path, monkeypatch, capsys):
    """Issue 58.7: resuming from step 4 of a run that went on to step 8 cut its metrics back and
    saved a new timeline's checkpoints among the old one's, where pruning took either. One
    directory holds one timeline: a branch goes to a new directory."""
    a = _run_with_checkpoints(tmp_path / "a", [4, 6, 8])
    before = (a / "metrics.jsonl").read_bytes()
    code, err = _refused_or_started(monkeypatch, capsys, [
        "train", f"trainer.output_dir={a}", f"resume={a}/checkpoints/step_4"])
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "went on past it (step_6, step_8)" in err and "new directory" in err
    assert (a / "metrics.jsonl").read_bytes() == before
    assert _refused_or_started(monkeypatch, capsys, [
        "train", f"trainer.output_dir={a}", f"resume={a}/checkpoints/step_8"])[0] == "started"


@pytest.mark.parametrize("given, on_gpu, merged", [
    ("auto", False, True), ("auto", True, False),     # CPU engines merged, GPU ones adapters
    ("true", True, True), ("false", False, False), ("True", True, True),
])
def test_lora_merge_resolves_for_where_the_engines_run(given, on_gpu, merged):
    from peer_rl.config.worker_settings import lora_merged

    cfg = load_config(["model.lora.rank=8", f"model.lora.merge={given}"])
    assert cfg.model.lora.merge == given.lower()
    assert lora_merged(cfg.model.lora, on_gpu) is merged


def test_loading_a_config_does_not_import_torch():
    """`plan`, `config` and every command's start check a config; torch costs ~2-4 s to import,
    so the check reads the registries' names without it (a child interpreter: this one has
    torch already)."""
    code = ("import sys; from peer_rl.config.schema import load_config; "
            "load_config(['recipe=peer_rur']); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.strip() == "False", out.stderr[-2000:]


@pytest.mark.parametrize("recipe, command", [("sft", "peer-rl sft recipe=sft"),
                                             ("unifireward", "peer-rl train-rm recipe=unifireward"),
                                             ("escrag_rm_tiny", "peer-rl train-rm")])
def test_a_supervised_recipe_given_to_a_grpo_command_names_the_command_that_runs_it(recipe,
                                                                                 command):
    with pytest.raises(ConfigError, match=f"recipe={recipe}: a supervised stage's recipe") as exc:
        load_config([f"recipe={recipe}"])
    assert command in str(exc.value) and len(str(exc.value).splitlines()) == 1


def test_a_supervised_recipe_through_a_base_is_named_too(tmp_path):
    mine = tmp_path / "my_sft.yaml"
    mine.write_text("base: sft\ntrainer:\n  total_steps: 3\n")
    with pytest.raises(ConfigError, match=r"\(kind: sft\).*peer-rl sft recipe="):
        load_config([f"recipe={mine}"])


def test_shared_prefixes_with_padded_rows_are_refused_at_start_up():
    with pytest.raises(ConfigError, match="actor.shared_prefix=true: not with "
                                          "actor.use_remove_padding=false"):
        load_config(["actor.shared_prefix=true", "actor.use_remove_padding=false"])
    assert load_config(["actor.use_remove_padding=false"]).actor.shared_prefix == "auto"


def test_dialogues_are_checked_at_start_up_naming_the_key():
    with pytest.raises(ConfigError, match=r"dialogue.emotion_start=120: expected 0 to 100"):
        load_config(["recipe=dialogue_tiny", "dialogue.emotion_start=120"])
    with pytest.raises(ConfigError, match=r"trainer.eval_freq=2: the in-training evaluation is "
                                          r"not supported with dialogues yet"):
        load_config(["recipe=dialogue_tiny", "trainer.eval_freq=2"])
    with pytest.raises(ConfigError, match=r"reward_model.kind=scalar and retrieval.enable=true"):
        load_config(["recipe=dialogue_tiny", "reward_model.kind=scalar", "retrieval.enable=true"])
    # dynamic sampling and the async look-ahead run with dialogues
    cfg = load_config(["recipe=dialogue_tiny", "algorithm.filter_groups.enable=true",
                       "trainer.async_training.staleness=1"])
    assert cfg.algorithm.filter_groups.enable and cfg.trainer.async_training.staleness == 1
