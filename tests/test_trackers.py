"""peer_rl.trackers on real W&B (offline) and MLflow (SQLite) runs, read back through their own
readers; no Ray. The end-to-end run that logs to both is tests/trainer/test_run.py."""
import json
import socket

import pytest
from tracker_util import mlflow_history, wandb_history, wandb_records

from peer_rl.config import ConfigError, load_config, public_config
from peer_rl.trackers import flat_params, open_trackers, wandb_mode

SECRET = "s3cret-tok"
STEPS = {1: {"reward/mean": 0.1234567890123, "actor/kl_loss": 1e-7, "timing/step": 12.5,
             "judge/ok": True, "note": "text"},
         2: {"reward/mean": -0.25, "actor/kl_loss": 3.0, "timing/step": 11},
         3: {"reward/mean": 0.75, "actor/kl_loss": 2.5, "timing/step": 10.0}}


def _cfg(out, *extra):
    return load_config([f"trainer.output_dir={out}", "trainer.loggers=[jsonl,wandb,mlflow]",
                        "trainer.wandb.mode=offline",
                        f"eval.judge_url=https://user:{SECRET}@judge.example/v1", *extra])


@pytest.fixture
def logged(tmp_path, monkeypatch):
    """Steps 1-2 logged, the trackers closed, then reopened as a resumed run logs step 3."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))      # no netrc, no W&B settings
    cfg = _cfg(tmp_path)
    first = open_trackers(cfg, tmp_path, False, public_config(cfg))
    for step in (1, 2):
        first.log(step, STEPS[step])
    ids = {k: t.run_id for k, t in first.active.items()}
    first.close()
    again = open_trackers(cfg, tmp_path, True, public_config(cfg))
    again.log(3, STEPS[3])
    again_ids = {k: t.run_id for k, t in again.active.items()}
    again.close()
    return tmp_path, ids, again_ids


def test_both_trackers_read_back_the_numbers_logged_and_a_resume_continues_their_runs(logged):
    out, ids, again_ids = logged
    assert again_ids == ids == json.loads((out / "trackers.json").read_text())
    # the numbers exactly, bools and text left out (as TensorBoard leaves them out)
    want = {s: {k: float(v) for k, v in m.items() if k not in ("judge/ok", "note")}
            for s, m in STEPS.items()}
    assert wandb_history(out) == want
    assert mlflow_history(f"sqlite:///{out / 'mlflow.db'}", ids["mlflow"]) == want
    # one MLflow run, finished; two W&B offline logs of one run id
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("peer-rl")
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs] == [ids["mlflow"]]
    assert runs[0].info.status == "FINISHED" and runs[0].info.run_name == "tiny"
    logs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(logs) == 2 and all(p.name.endswith(ids["wandb"]) for p in logs)


def test_the_config_is_logged_as_parameters_with_the_secret_redacted(logged):
    out, ids, _ = logged
    from mlflow.tracking import MlflowClient

    params = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}").get_run(
        ids["mlflow"]).data.params
    assert params["eval.judge_url"] == "https://***@judge.example/v1"
    assert params["rollout.n"] == "4" and params["trainer.loggers"] == '["jsonl", "wandb", "mlflow"]'
    assert params["experiment_name"] == "tiny"
    run = next(r for r in wandb_records(out) if r["type"] == "run")
    config = run["run"]["config"]["update"]
    assert config["eval"]["judge_url"] == "https://***@judge.example/v1"
    assert config["rollout"]["n"] == 4
    every_record = json.dumps(wandb_records(out))
    assert SECRET not in every_record and SECRET not in json.dumps(params)


def test_flat_params_dot_the_keys_and_write_lists_as_json():
    assert flat_params({"a": {"b": 1, "c": {"d": [1, "x"]}}, "e": "f", "g": None}) == {
        "a.b": "1", "a.c.d": '[1, "x"]', "e": "f", "g": "null"}


def test_a_tracker_that_fails_mid_run_is_dropped_and_the_others_go_on(tmp_path, monkeypatch,
                                                                      capsys):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = _cfg(tmp_path)
    trackers = open_trackers(cfg, tmp_path, False, public_config(cfg))
    trackers.log(1, STEPS[1])
    mlflow = trackers.active["mlflow"]
    mlflow.client.delete_run(mlflow.run_id)            # a store that refuses the next step
    trackers.log(2, STEPS[2])
    trackers.log(3, STEPS[3])
    trackers.close()
    err = capsys.readouterr().err
    assert "mlflow: logging step 2 failed" in err and "metrics.jsonl has every step" in err
    assert err.count("logging step") == 1
    assert sorted(wandb_history(tmp_path)) == [1, 2, 3]


@pytest.mark.parametrize("loggers, match", [
    ("[console,tensorbord]", r"trainer\.loggers=\['console', 'tensorbord'\]: unknown "
                             r"\['tensorbord'\]; expected any of"),
])
def test_an_unknown_logger_fails_at_start_up_naming_the_key(loggers, match):
    with pytest.raises(ConfigError, match=match):
        load_config([f"trainer.loggers={loggers}"])


def test_a_wrong_wandb_mode_fails_naming_the_key():
    with pytest.raises(ConfigError, match=r"trainer\.wandb\.mode"):
        load_config(["trainer.wandb.mode=cloud"])


def test_a_store_that_is_not_there_fails_naming_the_key(tmp_path):
    (tmp_path / "a_file").write_text("not a directory")
    cfg = load_config([f"trainer.output_dir={tmp_path}", "trainer.loggers=[mlflow]",
                       f"trainer.mlflow.tracking_uri=sqlite:///{tmp_path}/a_file/m.db"])
    with pytest.raises(ConfigError, match=r"^trainer\.mlflow\.tracking_uri: no MLflow store at "
                                          r"sqlite:///"):
        open_trackers(cfg, tmp_path, False, public_config(cfg))


def test_wandb_auto_is_offline_without_a_key_or_a_server_and_online_with_both(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))              # no ~/.netrc
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
        mode, why = wandb_mode("auto")
        assert mode == "offline" and "no WANDB_API_KEY" in why
        (tmp_path / ".netrc").write_text(f"machine 127.0.0.1 login user password {SECRET}\n")
        (tmp_path / ".netrc").chmod(0o600)
        assert wandb_mode("auto") == ("online", "a key for 127.0.0.1")
        (tmp_path / ".netrc").unlink()
        monkeypatch.setenv("WANDB_API_KEY", SECRET)
        assert wandb_mode("auto")[0] == "online"
    mode, why = wandb_mode("auto")                           # the server is gone
    assert mode == "offline" and "127.0.0.1 does not answer" in why
    assert wandb_mode("online") == ("online", "trainer.wandb.mode=online")
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_mode("auto")[0] == "offline"


@pytest.mark.e2e    # a `peer-rl train` subprocess (Ray starts; the pools must not)
def test_a_run_with_a_bad_tracking_uri_stops_before_its_pools_start(tmp_path):
    import subprocess
    import sys

    (tmp_path / "a_file").write_text("not a directory")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "peer_rl.cli", "train",
                           f"trainer.output_dir={out}", "trainer.loggers=[jsonl,mlflow]",
                           f"trainer.mlflow.tracking_uri=sqlite:///{tmp_path}/a_file/m.db"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "trainer.mlflow.tracking_uri: no MLflow store at sqlite:///" in proc.stderr
    assert "pools ready" not in proc.stdout and "engine dtype" in proc.stdout, proc.stdout
