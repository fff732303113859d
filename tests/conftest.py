"""Session fixtures: the tiny policy and judge, built once per test session."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    from peer_rl.tiny_models import ensure_tiny_models

    return ensure_tiny_models(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="session")
def trained_judge(tiny_models, tmp_path_factory) -> str:
    """The tiny judge after a short real `peer-rl train-rm`: it emits parseable verdicts, so
    GRPO rewards are non-zero (a random judge scores every sample 0)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("unifireward")
    cmd = [sys.executable, "-m", "peer_rl.cli", "train-rm", f"trainer.output_dir={out}",
           f"model.path={tiny_models['judge']}", "trainer.total_steps=80", "trainer.save_freq=0",
           "ray.address=local"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return str(out / "final")


@pytest.fixture(scope="session")
def grpo_models(tiny_models, trained_judge) -> dict[str, str]:
    """The models the GRPO end-to-end tests run: the tiny policy and the trained tiny judge."""
    return {"policy": tiny_models["policy"], "judge": trained_judge}


@pytest.fixture(scope="session")
def trained_scalar_rm(tiny_models, tmp_path_factory) -> str:
    """The tiny scalar reward model after a short real `train-rm recipe=escrag_rm_tiny`
    (Bradley-Terry, 2 FSDP2 ranks); returns its run directory (final/ is the model)."""
    import subprocess
    import sys

    from pathlib import Path

    out = tmp_path_factory.mktemp("escrag_rm")
    cache = Path(tiny_models["policy"]).parent       # the reward model is built beside them
    proc = subprocess.run([sys.executable, "-m", "peer_rl.cli", "train-rm", "recipe=escrag_rm_tiny",
                           f"trainer.output_dir={out}", f"model.tiny_cache_dir={cache}",
                           "trainer.total_steps=60", "trainer.save_freq=0", "ray.address=local"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return str(out)
