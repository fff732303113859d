"""Issue 24.12: bad inputs that used to end in tracebacks get one line naming the file, key or
line, and a non-zero exit, before anything starts."""
import json
from pathlib import Path

import pytest

from peer_rl.cli import main
from peer_rl.config.schema import ConfigError, load_config


def test_a_recipe_with_a_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  train_batch_size: 4\n rollout: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3: not valid YAML"):
        load_config([f"recipe={bad}"])
    assert main(["train", f"recipe={bad}"]) == 2
    assert "bad.yaml:3: not valid YAML" in capsys.readouterr().err


def test_a_line_nested_too_deep_is_a_counted_problem(tmp_path, capsys):
    (tmp_path / "grpo").mkdir()
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "grpo" / "textual.jsonl").write_text('{"history": ' + deep + "}\n")
    assert main(["data", "check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "textual.jsonl: 0/1 valid rows" in out and "nested too deep" in out


def test_train_files_may_not_leave_the_data_root(tmp_path, capsys):
    from peer_rl.data.bundled import copy_sample

    copy_sample(tmp_path / "root")
    (tmp_path / "outside.jsonl").write_text("{}\n")
    assert main(["train", f"data.root={tmp_path / 'root'}", "data.train_files=[../outside.jsonl]",
                 f"trainer.output_dir={tmp_path / 'run'}"]) == 2
    assert "data.train_files: '../outside.jsonl' leaves the data root" in capsys.readouterr().err
    assert main(["sft", f"data.root={tmp_path / 'root'}", "data.train_files=[sft/../../outside.jsonl]",
                 f"trainer.output_dir={tmp_path / 'sft'}"]) == 2
    assert "leaves the data root" in capsys.readouterr().err


def test_resume_from_a_directory_that_is_not_a_checkpoint_fails_before_the_pools(tmp_path,
                                                                                  capsys):
    (tmp_path / "ckpt").mkdir()
    assert main(["train", f"resume={tmp_path / 'ckpt'}",
                 f"trainer.output_dir={tmp_path / 'run'}"]) == 2
    assert "not a complete checkpoint (no trainer_state.json)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_an_eval_case_file_that_is_not_utf8_and_an_out_that_is_a_file(tmp_path, capsys):
    cards = tmp_path / "cards.json"
    cards.write_bytes(b'[{"id": "1",\n "name": "\xff\xfe"}]')
    assert main(["eval", "esc", "--out", str(tmp_path / "run"), f"esc.cards={cards}",
                 "model.url=http://127.0.0.1:9/v1", "seeker.url=http://127.0.0.1:9/v1",
                 "judge.url=http://127.0.0.1:9/v1"]) == 2
    assert "cards.json:2: not UTF-8" in capsys.readouterr().err
    good = tmp_path / "good.json"
    good.write_text(json.dumps([]))
    (tmp_path / "afile").write_text("x")
    from peer_rl.evaluation.store import RunMismatch, RunStore

    with pytest.raises(RunMismatch, match="exists and is not a directory"):
        RunStore(tmp_path / "afile", {})


def test_a_judge_adapter_that_is_not_one_fails_before_the_pools(tmp_path, capsys):
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    assert main(["train", f"reward_model.lora_path={tmp_path / 'adapter'}",
                 f"trainer.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert (f"reward_model.lora_path={str(tmp_path / 'adapter')!r}: no "
            "adapter_model.safetensors, judge_template.json there") in err
    assert main(["train", "reward_model.kind=scalar", f"reward_model.lora_path={tmp_path}",
                 f"trainer.output_dir={tmp_path / 'run'}"]) == 2
    assert "only the unifireward judge is served with an adapter" in capsys.readouterr().err


TINY = Path(__file__).resolve().parents[1] / "peer_rl" / "bundled" / "models" / "tiny"
PEFT_NONE = "(PEFT: No modules were targeted for adaptation)"


def test_a_lora_target_that_adapts_nothing_stops_train_before_ray_starts(tmp_path, capsys,
                                                                         monkeypatch):
    """Issue 58.16: model.lora is held against the policy's module tree (built on the meta
    device, no weight read) before Ray starts; a wrong target used to be found by a policy rank
    after the pools had started, and ended in two tracebacks."""
    import peer_rl.trainer.run as run

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started before model.lora was checked")

    monkeypatch.setattr(run, "init_ray", no_ray)
    policy = TINY / "policy"
    assert main(["train", f"model.path={policy}", f"reward_model.path={TINY / 'judge'}",
                 "model.lora.rank=4", "model.lora.target_modules=[nope]",
                 f"trainer.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [ln for ln in err.splitlines() if ln.startswith("error:")] == [
        f"error: model.lora.target_modules=['nope']: no layer of {policy} to adapt with "
        f"model.lora.rank=4 {PEFT_NONE}"]


@pytest.mark.parametrize("targets, message", [
    ("[q_proj,v_proj]", None),          # a control: targets the policy has pass
    ("[lm_head]", "model.lora.target_modules: lm_head shares its weight with the embeddings "
                  "(tied); leave it out"),
    ("[embed_tokens]", "model.lora.target_modules: model.language_model.embed_tokens is a "
                       "Embedding; only linear layers can be adapted here"),
    ("[qkv]", "model.lora.target_modules=['qkv']: no layer of {policy} to adapt with "
              f"model.lora.rank=4 {PEFT_NONE}"),     # the vision tower's, which stays untouched
])
def test_the_lora_check_names_what_the_policy_rank_would_refuse(targets, message):
    from peer_rl.trainer.run import check_policy_lora

    policy = str(TINY / "policy")
    cfg = load_config([f"model.path={policy}", "model.lora.rank=4",
                       f"model.lora.target_modules={targets}"])
    if message is None:
        check_policy_lora(cfg, policy)
        return
    with pytest.raises(ConfigError) as exc:
        check_policy_lora(cfg, policy)
    assert str(exc.value) == message.format(policy=policy)


def test_a_policy_whose_image_processor_does_not_load_is_named_before_the_pools(tmp_path):
    """Every policy rank of a vision-language policy loads its image processor, whatever the
    rows hold: measured_prompts (run while Ray starts, before any pool) loads it too and names
    model.path. It used to be loaded there only for rows with images (an OSError, exit 4), and
    for text rows first in the ranks."""
    import shutil

    from peer_rl.trainer.run import measured_prompts

    policy = tmp_path / "policy"
    shutil.copytree(TINY / "policy", policy)
    (policy / "processor_config.json").unlink()
    cfg = load_config([f"model.path={policy}"])
    rows = [{"id": "a", "messages": [{"role": "user", "content": "I lost my job."}]}]
    with pytest.raises(ConfigError) as exc:
        measured_prompts(cfg, rows, str(policy))
    assert str(exc.value).startswith(
        f"model.path={str(policy)!r}: its tokenizer or image processor does not load (Can't "
        f"load image processor for '{policy}'.")
