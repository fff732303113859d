"""Session fixtures: the tiny policy and judge, built once per test session."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    from peer_rl.tiny_models import ensure_tiny_models

    return ensure_tiny_models(tmp_path_factory.mktemp("tiny_models"))
