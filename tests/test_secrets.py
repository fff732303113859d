"""Issue 24.13: keys only over https (or to this machine), no credentials or environment secrets
written to disk, stores of dialogues private to the user, no terminal control from a model."""
import os
import stat

import pytest

from peer_rl.config import load_config, save_config
from peer_rl.evaluation.endpoints import (EndpointError, check_key_transport, party_record,
                                          redact_url)
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
    if refused:
        with pytest.raises(EndpointError, match="sent in the clear.*allow_insecure_http"):
            check_key_transport("judge", url, has_key, allowed)
    else:
        check_key_transport("judge", url, has_key, allowed)


def test_credentials_in_urls_are_not_recorded():
    assert redact_url("https://alice:s3cr3t@api.example.com/v1") == "https://***@api.example.com/v1"
    assert redact_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"
    party = {"url": "https://bob:pw@h/v1", "model": "m", "path": ""}
    assert party_record(party, ("url", "model")) == {"url": "https://***@h/v1", "model": "m"}


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
    from peer_rl.chat import printable

    text = "ok\x1b[2J\x1b]0;title\x07 done\x1b[31m!\x1b[0m\ttab\nnext\x9b"
    assert printable(text) == "ok done!\ttab\nnext"
