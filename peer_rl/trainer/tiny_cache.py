"""The tiny trained models the default runs use: the tiny judge after `train-rm`, the tiny
policy after `sft`, ESCRAG-R1's tiny reward model and cold-start policy; each trained once into
<cache_dir>/trained/ and reused."""
from __future__ import annotations

from pathlib import Path

from peer_rl.trainer.supervised import _log, run_supervised


def ensure_trained_tiny_reward_model(cache_dir: str | Path, ray_address: str = "") -> str:
    """The tiny scalar reward model after `train-rm recipe=escrag_rm_tiny` (Bradley-Terry on the
    sample's preference pairs), trained once into <cache_dir>/trained/reward and reused."""
    from peer_rl.supervised.config import load_supervised_config

    run_dir = Path(cache_dir) / "trained" / "reward"
    final = run_dir / "final"
    if not (final / "config.json").exists():
        _log(f"first run: training the tiny scalar reward model once (train-rm "
             f"recipe=escrag_rm_tiny, ~2 minutes on 2 cores; cached in {run_dir})")
        over = ["recipe=escrag_rm_tiny", f"trainer.output_dir={run_dir}",
                f"model.tiny_cache_dir={cache_dir}"]
        cfg = load_supervised_config(over + ([f"ray.address={ray_address}"] if ray_address
                                             else []), "bt")
        run_supervised(cfg, "bt")
    return str(final)


def ensure_trained_tiny_escrag_policy(cache_dir: str | Path, ray_address: str = "") -> str:
    """The tiny policy after ESCRAG-R1's cold start (`sft recipe=escrag_sft_tiny` from the tiny
    PEER-SFT policy, which already writes the sample's languages): writes `<think>...</think>`
    then a reply; trained once into <cache_dir>/trained/escrag_policy and reused."""
    from peer_rl.supervised.config import load_supervised_config

    run_dir = Path(cache_dir) / "trained" / "escrag_policy"
    final = run_dir / "final"
    if not (final / "config.json").exists():
        start = ensure_trained_tiny_models(cache_dir, ray_address)["policy"]
        _log(f"first run: the tiny policy's cold-start SFT on the <think> format once (sft "
             f"recipe=escrag_sft_tiny, ~1.5 minutes on 2 cores; cached in {run_dir})")
        over = ["recipe=escrag_sft_tiny", f"model.path={start}", f"trainer.output_dir={run_dir}"]
        cfg = load_supervised_config(over + ([f"ray.address={ray_address}"] if ray_address
                                             else []), "sft")
        run_supervised(cfg, "sft")
    return str(final)


def ensure_trained_tiny_models(cache_dir: str | Path, ray_address: str = "") -> dict[str, str]:
    """The tiny judge after `peer-rl train-rm` and the tiny policy after `peer-rl sft` (their
    default recipes, on the bundled sample), trained once into <cache_dir>/trained and reused.

    A random judge answers nothing parseable and a random policy writes no Step markers, so a
    GRPO run between them shows reward 0 on every step; these have learned the formats, which
    is what the default `peer-rl train` starts from. An interrupted build resumes (Ray Train's
    own resume on the same output directory)."""
    from peer_rl.supervised.config import load_supervised_config

    out = {}
    for kind, name in (("rm", "judge"), ("sft", "policy")):
        run_dir = Path(cache_dir) / "trained" / name
        final = run_dir / "final"
        if not (final / "config.json").exists():
            _log(f"first run: training the tiny {name} once ({'train-rm' if kind == 'rm' else 'sft'}"
                 f", ~2-3 minutes on 2 cores; cached in {run_dir})")
            over = [f"trainer.output_dir={run_dir}", f"model.tiny_cache_dir={cache_dir}"]
            cfg = load_supervised_config(over + ([f"ray.address={ray_address}"] if ray_address
                                                 else []), kind)
            run_supervised(cfg, kind)
        out[name] = str(final)
    return out
