"""Issue 24.13: keys only over https (or to this machine), no credentials or environment secrets
written to disk, stores of dialogues private to the user, no terminal control from a model."""
import os
import stat

import pytest

from peer_rl.config.schema import load_config, save_config
from peer_rl.config.credentials import check_key_transport, key_variable, redact_text
from peer_rl.evaluation.endpoints import EndpointError
from peer_rl.evaluation.store import RunStore


@pytest.mark.parametrize("url, has_key, allowed, refused", [
    ("http://judge.example.com/v1", True, False, True),
    ("http://judge.example.com/v1", False, False, False),     # no key: nothing to leak
    ("http://judge.example.com/v1", True, True, False),       # the user said so
    ("https://judge.example.com/v1", True, False, False),
    ("http://127.0.0.1:8000/v1", True, False, False),
    ("http://localhost:8000/v1", True, False, False),
    ("http://[::1]:8000/v1", True, False, False),
    ("http://10.0.0.5:8000/v1", True, False, True),
])
def test_a_key_never_goes_in_the_clear_to_another_host(url, has_key, allowed, refused):
    args = ("judge.url", url, "JUDGE_KEY" if has_key else "", "judge.allow_insecure_http",
            allowed, EndpointError)
    if refused:
        with pytest.raises(EndpointError, match="sent in the clear.*allow_insecure_http"):
            check_key_transport(*args)
    else:
        check_key_transport(*args)


def test_a_urls_own_password_is_a_credential_too():
    with pytest.raises(ValueError, match=r"^judge\.url=http://\*\*\*@10\.0\.0\.5/v1: the "
                                         r"URL's user:password would be sent in the clear to "
                                         r"10\.0\.0\.5"):
        check_key_transport("judge.url", "http://bob:pw@10.0.0.5/v1", "",
                            "judge.allow_insecure_http", False)


@pytest.mark.parametrize("text, shown", [
    ("https://alice:s3cr3t@api.example.com/v1", "https://***@api.example.com/v1"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("https://bob:p@ss@host", "https://***@host"),                 # a password holding @
    ("see https://bob:p?w@host/v1 and http://h/x", "see https://***@host/v1 and http://h/x"),
    ("sqlite:////data/m@x.db", "sqlite:////data/m@x.db"),          # no authority: no userinfo
])
def test_credentials_in_urls_are_not_recorded(text, shown):
    assert redact_text(text) == shown


def test_saved_configs_keep_environment_values_as_interpolations(tmp_path, monkeypatch):
    monkeypatch.setenv("PEER_RL_TEST_TOKEN", "tok-123")
    cfg = load_config(["ray.dashboard_host=${oc.env:PEER_RL_TEST_TOKEN}"])
    assert cfg.ray.dashboard_host == "tok-123"
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "tok-123" not in text and "${oc.env:PEER_RL_TEST_TOKEN}" in text


def test_run_stores_are_private_to_the_user(tmp_path):
    store = RunStore(tmp_path / "run", {"protocol": "esc"})
    store.append({"id": "1", "turns": ["a seeker's words"]})
    store.close()
    assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "run" / "cases.jsonl").st_mode) == 0o600


def test_chat_prints_no_terminal_control_from_the_model():
    from peer_rl.evaluation.chat import printable

    text = "ok\x1b[2J\x1b]0;title\x07 done\x1b[31m!\x1b[0m\ttab\nnext\x9b"
    assert printable(text) == "ok done!\ttab\nnext"


@pytest.mark.parametrize("url, api_key_env, sent", [
    ("https://api.openai.com/v1", "", "OPENAI_API_KEY"),          # OpenAI's own API
    ("https://API.OpenAI.com/v1", "", "OPENAI_API_KEY"),
    ("http://api.openai.com/v1", "", ""),                         # not over https
    ("https://api.openai.com.evil.example/v1", "", ""),           # a look-alike host
    ("https://judge.example.com/v1", "", ""),                     # a third party: nothing
    ("http://127.0.0.1:8000/v1", "", ""),
    ("https://judge.example.com/v1", "MY_JUDGE_KEY", "MY_JUDGE_KEY"),   # named for it
    ("https://api.openai.com/v1", "OTHER", "OTHER"),
])
def test_a_key_goes_only_where_it_was_named(url, api_key_env, sent):
    assert key_variable(url, api_key_env) == sent


def test_a_secret_reached_through_another_interpolation_is_not_saved(tmp_path, monkeypatch):
    monkeypatch.setenv("PEER_RL_TEST_TOKEN", "tok-4567-secret")
    cfg = load_config(["eval.judge_url=https://judge.example.com/${oc.env:PEER_RL_TEST_TOKEN}/v1",
                       "eval.judge_model=${eval.judge_url}"])
    assert cfg.eval.judge_model == "https://judge.example.com/tok-4567-secret/v1"
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "tok-4567" not in text
    import yaml

    data = yaml.safe_load(text)
    assert data["eval"]["judge_model"] == "${eval.judge_url}"
    assert data["eval"]["judge_url"] == ("https://judge.example.com/"
                                         "${oc.env:PEER_RL_TEST_TOKEN}/v1")


def test_url_credentials_are_not_saved(tmp_path):
    cfg = load_config(["eval.judge_url=https://alice:pw-9876@judge.example.com/v1"])
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "pw-9876" not in text and "alice" not in text
    assert "https://***@judge.example.com/v1" in text
    assert redact_text("see http://u:p@h:1/x and https://h/y") == "see http://***@h:1/x and https://h/y"


def test_the_verl_judges_messages_carry_no_url_credentials():
    import asyncio
    import socket

    from peer_rl.integrations.judge_http import HttpJudge, JudgeUnreachable

    with socket.socket() as s:                 # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    judge = HttpJudge(f"http://alice:pw-5555@127.0.0.1:{port}/v1", "m", timeout_s=2, retries=1)
    with pytest.raises(JudgeUnreachable) as err:
        asyncio.run(judge.answer([{"role": "user", "content": "hi"}], 4))
    assert "pw-5555" not in str(err.value) and "alice" not in str(err.value)
    assert f"judge at http://***@127.0.0.1:{port}/v1/chat/completions" in str(err.value)


def test_a_quoted_environment_name_reached_through_another_key_is_not_saved(tmp_path,
                                                                            monkeypatch):
    """Issue 58.8: `${oc.env:"NAME"}` (quoted) read through eval.judge_model, in config.yaml."""
    monkeypatch.setenv("PEER_RL_TEST_TOKEN", "tok-58-quoted")
    cfg = load_config(['eval.judge_url=https://judge.example.com/${oc.env:"PEER_RL_TEST_TOKEN"}'
                       "/v1", "eval.judge_model=${eval.judge_url}"])
    assert cfg.eval.judge_model == "https://judge.example.com/tok-58-quoted/v1"
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "tok-58" not in text
    assert "judge_model: ${eval.judge_url}" in text
    assert """judge_url: https://judge.example.com/${oc.env:"PEER_RL_TEST_TOKEN"}/v1""" in text


def test_an_evaluations_run_file_keeps_the_judge_urls_interpolation(tmp_path, monkeypatch):
    """Issue 58.8: run.json (the manifest a rerun compares) holds no key from a judge URL."""
    import json

    from peer_rl.evaluation.config import load_eval_config
    from peer_rl.evaluation.run import manifest_of

    monkeypatch.setenv("PEER_RL_TEST_TOKEN", "tok-58-runjson")
    cfg = load_eval_config("ccj", ["model.url=https://carol:pw-58@model.example.com/v1",
                                   "judge.url=https://judge.example.com/v1?key="
                                   "${oc.env:PEER_RL_TEST_TOKEN}"])
    RunStore(tmp_path / "run", manifest_of("ccj", cfg, {})).close()
    text = (tmp_path / "run" / "run.json").read_text()
    assert "tok-58" not in text and "pw-58" not in text
    parties = json.loads(text)["parties"]
    assert parties["judge"]["url"] == ("https://judge.example.com/v1?key="
                                       "${oc.env:PEER_RL_TEST_TOKEN}")
    assert parties["model"]["url"] == "https://***@model.example.com/v1"


def test_a_ladder_hands_its_rungs_the_environment_reference(tmp_path, monkeypatch):
    """As a chain does: each rung's evaluation reads the environment itself, so its run.json
    keeps `${oc.env:...}`; the ladder's own interpolations are filled in."""
    from peer_rl.evaluation.ladder import load_ladder

    monkeypatch.setenv("PEER_RL_TEST_TOKEN", "tok-58-ladder")
    path = tmp_path / "l.yaml"
    path.write_text("protocol: ccj\npaths: {a: /ckpt/a}\n"
                    "common: ['judge.url=https://judge.example.com/"
                    "${oc.env:PEER_RL_TEST_TOKEN}/v1']\n"
                    "rungs:\n  - {name: r1, overrides: ['model.path=${paths.a}']}\n")
    _, runs = load_ladder(str(path), [])
    assert runs == [["judge.url=https://judge.example.com/${oc.env:PEER_RL_TEST_TOKEN}/v1",
                     "model.path=/ckpt/a"]]


def test_two_configs_loaded_one_after_another_never_mix(monkeypatch):
    """The values a config had before resolution live on the config itself: dropping the first
    leaves nothing behind for the second (or any later object) to be redacted with."""
    import gc

    from peer_rl.config.schema import public_config

    monkeypatch.setenv("PEER_RL_TEST_TOKEN", "tok-first-777")
    first = load_config(["eval.judge_url=https://judge.example.com/${oc.env:PEER_RL_TEST_TOKEN}",
                         "eval.judge_model=${eval.judge_url}"])
    assert public_config(first)["eval"]["judge_model"] == "${eval.judge_url}"
    del first
    gc.collect()
    second = load_config(["eval.judge_url=https://other.example.com/v1",
                          "eval.judge_model=plain-model"])
    public = public_config(second)["eval"]
    assert public["judge_model"] == "plain-model"
    assert public["judge_url"] == "https://other.example.com/v1"


def test_a_config_sent_to_another_process_still_hides_its_secrets(monkeypatch):
    """A pickled config (as Ray hands it to an actor) is another object: its raw values go with
    it, so public_config there writes the interpolation, not the token."""
    import pickle

    from peer_rl.config.schema import public_config

    monkeypatch.setenv("PEER_RL_TEST_TOKEN", "tok-pickled-31")
    cfg = load_config(["ray.dashboard_host=${oc.env:PEER_RL_TEST_TOKEN}"])
    there = pickle.loads(pickle.dumps(cfg))
    assert there.ray.dashboard_host == "tok-pickled-31"
    assert public_config(there)["ray"]["dashboard_host"] == "${oc.env:PEER_RL_TEST_TOKEN}"
