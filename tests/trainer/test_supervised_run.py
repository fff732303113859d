"""The supervised launcher's progress bar, read off the metrics rank 0 writes (no Ray)."""
import io
import json

from peer_rl.trainer.supervised_run import StepBar


def test_the_bar_follows_the_newest_complete_record_and_ends_on_the_last(tmp_path, monkeypatch):
    metrics = tmp_path / "metrics.jsonl"
    bar = StepBar(metrics, total=150, name="sft", poll_s=60)    # polled here by hand
    assert bar.latest() is None                                 # nothing written yet
    metrics.write_text(json.dumps({"step": 25, "loss": 4.5}) + "\n")
    assert bar.latest() == {"step": 25, "loss": 4.5}
    # a record being written when the driver reads is skipped, the one before it shown
    metrics.write_text(json.dumps({"step": 25, "loss": 4.5}) + "\n" + '{"step": 50, "lo')
    assert bar.latest() == {"step": 25, "loss": 4.5}
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with bar:
        metrics.write_text("\n".join(json.dumps({"step": s, "loss": 1.0 / s})
                                     for s in (25, 50, 150)) + "\n")
    assert bar.bar.n == 150
    shown = err.getvalue()          # a StringIO is no terminal: the bar's lines, whole
    assert "\r" not in shown
    last = shown.splitlines()[-1]
    assert last.startswith("sft: 100%") and "150/150" in last and "loss=0.0067" in last



def test_the_worker_config_holds_the_recipe_and_the_overrides(tmp_path, monkeypatch):
    """loop_config, the one place a stage's config becomes the ranks' TrainLoopConfig: the
    values of recipes/unifireward_tiny.yaml and of the overrides, read off by hand."""
    from peer_rl.supervised.config import load_supervised_config
    from peer_rl.trainer.supervised_run import loop_config

    monkeypatch.chdir(tmp_path)
    cfg = load_supervised_config(["trainer.output_dir=runs/rm", "trainer.lr=3e-4",
                                  "model.lora.rank=4", "trainer.verdict_balance=true",
                                  "resources.gpus_per_worker=1", "data.languages=[english]"],
                                 "rm")
    config = loop_config(cfg, "rm", "/models/judge", tmp_path / "data",
                         {"judge_template.json": "{}"}, 150)
    assert (config.kind, config.train_files, config.languages) == (
        "rm", ("ser/*/*_train.jsonl",), ("english",))
    assert (config.lr, config.lr_scheduler, config.warmup_steps, config.min_lr_ratio) == (
        3e-4, "cosine", 10, 0.1)
    assert (config.batch_size, config.micro_batch_size, config.max_length) == (8, 1, 2048)
    assert (config.total_steps, config.save_freq, config.log_freq, config.dtype) == (
        150, 75, 25, "float32")
    assert config.verdict_balance is True
    assert (config.lora.rank, config.lora.lora_alpha, config.lora.target_modules) == (
        4, 16.0, ["all-linear"])
    assert config.output_dir == str(tmp_path / "runs" / "rm")      # resolved on the driver
    assert config.data_root == str(tmp_path / "data") and config.model_path == "/models/judge"
    assert config.extra_files == {"judge_template.json": "{}"}
    assert config.use_gpu is True and config.cpus_per_worker == 1 and config.verbose is False
