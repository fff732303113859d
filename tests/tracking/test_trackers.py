"""peer_rl.tracking.trackers on real W&B (offline) and MLflow (SQLite) runs, read back through their own
readers; no Ray. The end-to-end run that logs to both is tests/trainer/test_run.py."""
import json
import socket

import pytest
from tracker_util import mlflow_history, wandb_history, wandb_records

from peer_rl.config.schema import ConfigError, load_config, public_config
from peer_rl.tracking.trackers import flat_params, open_trackers, wandb_mode

SECRET = "s3cret-tok"
STEPS = {1: {"reward/mean": 0.1234567890123, "actor/kl_loss": 1e-7, "timing_s/step": 12.5,
             "judge/ok": True, "note": "text"},
         2: {"reward/mean": -0.25, "actor/kl_loss": 3.0, "timing_s/step": 11},
         3: {"reward/mean": 0.75, "actor/kl_loss": 2.5, "timing_s/step": 10.0}}


def _cfg(out, *extra):
    return load_config([f"trainer.output_dir={out}", "trainer.loggers=[jsonl,wandb,mlflow]",
                        "trainer.wandb.mode=offline",
                        f"eval.judge_url=https://user:{SECRET}@judge.example/v1", *extra])


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """Steps 1-2 logged, the trackers closed, then reopened as a resumed run logs step 3 (once
    for the module: its tests only read what was written)."""
    tmp_path = tmp_path_factory.mktemp("logged")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("HOME", str(tmp_path / "home"))      # no netrc, no W&B settings
        return _log_and_resume(tmp_path)


def _log_and_resume(tmp_path):
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


def test_a_quoted_environment_name_reached_through_another_key_is_not_a_parameter(
        tmp_path, monkeypatch):
    """Issue 58.8: MLflow's parameters are config.yaml's values, `${oc.env:"NAME"}` included."""
    monkeypatch.setenv("PEER_RL_TEST_TOKEN", "tok-58-param")
    cfg = load_config([f"trainer.output_dir={tmp_path}", "trainer.loggers=[mlflow]",
                       'eval.judge_url=https://judge.example/${oc.env:"PEER_RL_TEST_TOKEN"}/v1',
                       "eval.judge_model=${eval.judge_url}"])
    trackers = open_trackers(cfg, tmp_path, False, public_config(cfg))
    run_id = trackers.active["mlflow"].run_id
    trackers.close()
    from mlflow.tracking import MlflowClient

    params = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(
        run_id).data.params
    assert params["eval.judge_model"] == "${eval.judge_url}"
    assert params["eval.judge_url"] == 'https://judge.example/${oc.env:"PEER_RL_TEST_TOKEN"}/v1'
    assert "tok-58" not in json.dumps(params)


def _no_retries(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")


def test_an_unreachable_stores_error_line_carries_no_password(tmp_path, monkeypatch):
    """Issue 58.8: MLflow's own message repeats the URI; the line shows it as *** too."""
    _no_retries(monkeypatch)
    with socket.socket() as s:                 # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = load_config([f"trainer.output_dir={tmp_path}", "trainer.loggers=[mlflow]",
                       f"trainer.mlflow.tracking_uri=http://bob:pw-5858@127.0.0.1:{port}/x"])
    with pytest.raises(ConfigError) as err:
        open_trackers(cfg, tmp_path, False, public_config(cfg))
    line = str(err.value)
    assert "pw-5858" not in line and "bob" not in line
    assert line.startswith(f"trainer.mlflow.tracking_uri: no MLflow store at "
                           f"http://***@127.0.0.1:{port}/x (MlflowException: API request to "
                           f"http://***@127.0.0.1:{port}/x/api/2.0/mlflow/experiments/")


class _Recorder:
    """An HTTP server on this machine that answers 401 and keeps each request's Authorization."""

    def __init__(self):
        import http.server
        import threading

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append(self.headers.get("Authorization"))
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"error_code": "UNAUTHENTICATED", "message": "no"}')

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("home, token_env, sent", [
    ("", "", None),                                    # a recipe's URI: not the token's server
    ("http://localhost:{port}", "", None),             # another server (by name) than this one
    ("http://127.0.0.1:{port}", "", "Bearer tok-59-env"),          # the server it was set for
    ("", "PEER_RL_TEST_MLFLOW_TOKEN", "Bearer tok-59-named"),      # named for this URI
])
def test_the_tracking_token_goes_only_to_the_server_named_for_it(tmp_path, monkeypatch, capsys,
                                                                  home, token_env, sent):
    """Issue 58.9: $MLFLOW_TRACKING_TOKEN goes to $MLFLOW_TRACKING_URI's server, or where
    trainer.mlflow.token_env names a variable; a server that records the header says which
    reached it (its 401 then ends the tracker, as a refusing store does)."""
    _no_retries(monkeypatch)
    server = _Recorder()
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-59-env")
        monkeypatch.setenv("PEER_RL_TEST_MLFLOW_TOKEN", "tok-59-named")
        if home:
            monkeypatch.setenv("MLFLOW_TRACKING_URI", home.format(port=server.port))
        else:
            monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        cfg = load_config([f"trainer.output_dir={tmp_path}", "trainer.loggers=[mlflow]",
                           f"trainer.mlflow.tracking_uri=http://127.0.0.1:{server.port}"]
                          + [f"trainer.mlflow.token_env={token_env}"] * bool(token_env))
        with pytest.raises(ConfigError, match="no MLflow store"):
            open_trackers(cfg, tmp_path, False, public_config(cfg))
    finally:
        server.close()
    assert server.seen and set(server.seen) == {sent}
    if sent is None:
        assert ("[peer-rl] mlflow: $MLFLOW_TRACKING_TOKEN not sent to "
                f"http://127.0.0.1:{server.port}") in capsys.readouterr().err


def test_the_tracking_token_is_not_sent_in_the_clear_to_another_host(tmp_path, monkeypatch):
    """Issue 58.9: the judge's transport rule holds for the tracker's token: refused before any
    request, naming the key that allows it."""
    _no_retries(monkeypatch)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-59-clear")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://192.0.2.1:5000")   # TEST-NET: no host
    cfg = load_config([f"trainer.output_dir={tmp_path}", "trainer.loggers=[mlflow]"])
    with pytest.raises(ConfigError) as err:
        open_trackers(cfg, tmp_path, False, public_config(cfg))
    assert str(err.value) == (
        "trainer.mlflow.tracking_uri=http://192.0.2.1:5000: the key in $MLFLOW_TRACKING_TOKEN "
        "would be sent in the clear to 192.0.2.1; use https, unset it, or set "
        "trainer.mlflow.allow_insecure_http=true")


@pytest.mark.parametrize("uri, store", [("file://{root}/mlruns", "{root}/mlruns"),
                                        ("{root}/mlruns", "{root}/mlruns"),
                                        ("sqlite:///{root}/mlflow.db", "{root}/mlflow.db")])
def test_a_local_store_inside_the_data_root_is_refused_naming_the_key(tmp_path, monkeypatch,
                                                                      capsys, uri, store):
    """Issue 58.11: a local tracking store is held to the rule every output follows; `peer-rl
    train` ends in one error line before it writes anything (the run itself never starts)."""
    import peer_rl.trainer.run as train_run
    from peer_rl.cli import main

    def started(*args):
        raise AssertionError("the run started")

    monkeypatch.setattr(train_run, "_train", started)
    root = tmp_path / "data"
    (root / "grpo").mkdir(parents=True)
    code = main(["train", f"trainer.output_dir={tmp_path / 'run'}", f"data.root={root}",
                 "trainer.loggers=[jsonl,mlflow]",
                 f"trainer.mlflow.tracking_uri={uri.format(root=root)}", "logging.verbose=true"])
    assert (code, capsys.readouterr().err) == (
        2, f"error: trainer.mlflow.tracking_uri {store.format(root=root)}: is inside the input "
           f"{root}; write to a path outside it (the input stays as it is)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]     # no run directory
    assert [p.name for p in root.iterdir()] == ["grpo"]               # no store
