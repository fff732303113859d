"""`peer-rl eval ladder FILE --out DIR`: one evaluation per rung of an ablation ladder or sweep,
then the rungs side by side (compare.md/.json/.png in DIR).

A ladder file (recipes/ladders/*.yaml) names the protocol, the checkpoints (`paths`, set on the
command line as paths.NAME=DIR), overrides shared by every rung (`common`, typically the judge)
and the rungs, each a name and its eval overrides; `${paths.NAME}` refers to a checkpoint.
Extra command-line arguments: `paths.NAME=...` fills a path, anything else is a shared eval
override (judge.url=..., limit=20). Each rung runs in DIR/<name> and resumes like any eval run,
so rerunning the command finishes what an interrupted one left.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from peer_rl.config.schema import RECIPES_DIR, ConfigError, env_kept, yaml_by_name
from peer_rl.evaluation.config import load_eval_config

log = logging.getLogger(__name__)

LADDERS_DIR = RECIPES_DIR / "ladders"


@dataclass
class Rung:
    name: str
    overrides: list[str] = field(default_factory=list)
    train: str = ""            # how the rung's checkpoint is made (shown, not run)


@dataclass
class Ladder:
    protocol: str = "ccj"
    paths: dict[str, str] = field(default_factory=dict)
    common: list[str] = field(default_factory=list)
    rungs: list[Rung] = field(default_factory=list)


def ladder_path(name: str) -> Path:
    return yaml_by_name(name, LADDERS_DIR, "ladder")


def load_ladder(name: str, args: list[str]) -> tuple[Ladder, list[list[str]]]:
    """The ladder and each rung's full override list (common, rung, command line)."""
    path = ladder_path(name)
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Ladder), OmegaConf.load(path))
    except Exception as exc:  # omegaconf's validation errors name the key
        raise ConfigError(f"{path}: {exc}") from None
    extra = []
    for a in args:
        key, sep, value = a.partition("=")
        if not sep:
            raise ConfigError(f"{a!r}: expected key=value")
        if key.startswith("paths."):
            OmegaConf.update(cfg, key, value)
        else:
            extra.append(a)
    if not cfg.rungs:
        raise ConfigError(f"{path}: no rungs")
    names = [r.name for r in cfg.rungs]
    if len(set(names)) != len(names) or any(not n or n in (".", "..") or "/" in n or "\\" in n
                                            for n in names):
        raise ConfigError(f"{path}: rung names must be unique plain names (non-empty, no '/', "
                          f"'\\' or '..'): {names}")
    # the rungs' overrides keep `${oc.env:...}`: each evaluation reads the environment itself
    # and its run.json keeps the reference, not the secret
    resolved = OmegaConf.to_container(OmegaConf.create(env_kept(OmegaConf.to_container(
        cfg, resolve=False))), resolve=True)
    runs = []
    for rung in resolved["rungs"]:
        over = list(resolved["common"]) + list(rung["overrides"]) + extra
        unset = [o for o in over if "=<" in o]
        if unset:
            keys = sorted(k for k, v in resolved["paths"].items() if str(v).startswith("<"))
            raise ConfigError(f"{path}: rung {rung['name']!r} needs {', '.join(unset)}; set "
                              + ", ".join(f"paths.{k}=DIR" for k in keys)
                              + " on the command line")
        runs.append(over)
    return OmegaConf.to_object(cfg), runs


def run_ladder(name: str, out: str | Path, args: list[str]) -> Path:
    from peer_rl.evaluation.report import compare_runs  # deferred: tests patch compare_runs
    from peer_rl.evaluation.run import evaluate  # deferred: pulls in torch

    ladder, runs = load_ladder(name, args)
    cfgs = [load_eval_config(ladder.protocol, over) for over in runs]   # all checked up front
    out = Path(out)
    for i, (rung, cfg) in enumerate(zip(ladder.rungs, cfgs)):
        log.info(f"ladder rung {i + 1}/{len(cfgs)}: {rung.name}")
        evaluate(ladder.protocol, cfg, out / rung.name)
    return compare_runs([out / r.name for r in ladder.rungs], out,
                        [r.name for r in ladder.rungs])
