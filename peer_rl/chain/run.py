"""`peer-rl chain NAME [out=DIR] [key=value ...]`: a pipeline of peer-rl stages (fetch, sft,
train-rm, eval rm, GRPO runs per recipe and seed, held-out evaluations) run in order, each a
`peer-rl` command of its own, then a comparison report.

A chain file (recipes/chains/*.yaml) holds `out` (where every stage writes), `seeds`, any other
values the stages interpolate, and `stages`: each a `name`, the `run` arguments of one peer-rl
command and `done`, a path that exists once the stage has finished. A stage whose `done` exists
is skipped, so rerunning the command continues an interrupted chain (the GRPO stages also pass
resume=auto and continue from their last checkpoint); a `done` file that is JSON must parse, a
damaged one is moved aside to `<name>.damaged` (`.damaged.1`, ... beside an earlier copy) and its
stage runs again; `--dry-run` writes nothing, a damaged mark included. The chain holds a lock
on `out` while it runs: a second chain there is refused, naming the first's pid. `{seed}` in a
stage with `per_seed: true` expands it once per seed. Each stage's output goes to
<out>/logs/<stage>.log; a failing stage stops the chain with its exit status and the log named.
A chain file whose values are not of those types (a `run` that is not arguments, a `name` that
is not a plain name, `seeds` not a list of integers, ...) is refused in one line naming the key.
"""
from __future__ import annotations

import logging
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from peer_rl.chain.report import write_chain_report
from peer_rl.config.schema import RECIPES_DIR, ConfigError, env_kept, load_yaml, yaml_by_name
from peer_rl.config.credentials import redact_text
from peer_rl.files.out_paths import (DamagedFile, claim_dir, lock_dir, move_aside, open_append,
                                     read_json)

logger = logging.getLogger(__name__)

CHAINS_DIR = RECIPES_DIR / "chains"


@dataclass(frozen=True)
class Stage:
    name: str
    run: tuple[str, ...]     # the peer-rl arguments
    done: str                # exists once the stage has finished


def load_chain(name: str, overrides=()) -> tuple[dict, list[Stage]]:
    """The chain's values (out, seeds, ...) and its stages, seeds expanded, paths resolved."""
    path = yaml_by_name(name, CHAINS_DIR, "chain")
    raw = load_yaml(path)
    for key in ("out", "stages"):
        if key not in raw:
            raise ConfigError(f"{path}: no `{key}:` (a chain needs out and stages)")
    try:
        cfg = OmegaConf.merge(raw, OmegaConf.from_dotlist(list(overrides)))
        values = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:   # omegaconf's errors name the key, on lines of their own
        raise _config_error(path, exc) from None
    _check_shape(path, values)
    try:
        # the stages' arguments keep `${oc.env:...}`: each stage reads the environment itself
        # and saves the reference, and no secret is printed or put on a command line
        handed = OmegaConf.to_container(OmegaConf.create(env_kept(OmegaConf.to_container(
            cfg, resolve=False))), resolve=True)["stages"]
    except Exception as exc:
        raise _config_error(path, exc) from None
    for s, h in zip(values["stages"], handed):
        s["run"] = h["run"]           # the rest (name, done, per_seed) as the chain reads them
    stages: list[Stage] = []
    for block in _blocks(values["stages"]):
        seeds = values.get("seeds", [0]) if block[0].get("per_seed") else [None]
        for seed in seeds:            # seed-major: every recipe of seed 0, then of seed 1
            for s in block:
                stages.append(_stage(path, s, seed))
    names = [s.name for s in stages]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{path}: stage names repeat: {dup}")
    return values, stages


def _config_error(path: Path, exc: Exception) -> ConfigError:
    """OmegaConf's message (it names the key) on one line."""
    lines = (ln.strip() for ln in str(exc).splitlines())
    return ConfigError(f"{path}: {'; '.join(ln for ln in lines if ln)}")


def _check_shape(path: Path, values: dict) -> None:
    """Each value of the types the chain reads it as, the key named where one is not."""
    def wrong(key: str, expected: str, found) -> ConfigError:
        return ConfigError(f"{path}: {key}: expected {expected}, found {found!r}")

    if not isinstance(values["out"], str) or not values["out"]:
        raise wrong("out", "the directory every stage writes into", values["out"])
    seeds = values.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in seeds):
        raise wrong("seeds", "a list of integers", seeds)
    if not isinstance(values["stages"], list):       # [] runs no stage, only the report
        raise wrong("stages", "a list of stages, each {name, run, done}", values["stages"])
    for i, s in enumerate(values["stages"]):
        if not isinstance(s, dict):
            raise wrong(f"stages[{i}]", "a stage {name, run, done}", s)
        missing = [k for k in ("name", "run", "done") if k not in s]
        if missing:
            raise ConfigError(f"{path}: stages[{i}] lacks {missing} (each stage needs a name, "
                              "the peer-rl arguments to run and the path that marks it done)")
        if not isinstance(s["name"], str) or not _NAME.fullmatch(s["name"]):
            raise wrong(f"stages[{i}].name", "a plain name (letters, digits, _ . - and {seed}; "
                        "its log is logs/<name>.log)", s["name"])
        run = s["run"]
        if not (isinstance(run, str) and run.strip() or isinstance(run, list) and run and all(
                isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in run)):
            raise wrong(f"stages[{i}].run", "the peer-rl arguments (a string or a list of "
                        "strings)", run)
        if not isinstance(s["done"], str) or not s["done"]:
            raise wrong(f"stages[{i}].done", "the path that exists once the stage has finished",
                        s["done"])
        if not isinstance(s.get("per_seed", False), bool):
            raise wrong(f"stages[{i}].per_seed", "true or false", s["per_seed"])


# a stage's name, which names its log file: no path separator, no climbing
_NAME = re.compile(r"(?!\.+$)[\w.{}-]+")


def _blocks(stages: list[dict]) -> list[list[dict]]:
    """Runs of consecutive stages alike in per_seed."""
    out: list[list[dict]] = []
    for s in stages:
        if out and bool(out[-1][0].get("per_seed")) == bool(s.get("per_seed")):
            out[-1].append(s)
        else:
            out.append([s])
    return out


def _stage(path: Path, s: dict, seed) -> Stage:
    """{seed} filled in; a `key=` argument with nothing after `=` (an unset chain value)
    is left out, so the command keeps its own default."""
    def fill(text: str) -> str:
        return text if seed is None else text.replace("{seed}", str(seed))

    try:
        run = s["run"] if isinstance(s["run"], list) else shlex.split(s["run"])
    except ValueError as exc:             # shlex: an unclosed quote
        raise ConfigError(f"{path}: stage {s['name']}: run: {exc} in {s['run']!r}") from None
    args = [fill(str(a)) for a in run]
    args = [a for a in args if not re.fullmatch(r"[\w.]+=", a)]
    return Stage(fill(s["name"]), tuple(args), fill(str(s["done"])))


def stage_done(done: str | Path, dry_run: bool = False) -> bool:
    """Whether a stage's `done` path marks it finished. Every stage writes its mark whole
    (peer_rl.files.out_paths.write_atomic), so a JSON mark that does not parse was written by
    something else or damaged later: it is moved aside (kept under `<name>.damaged`, or
    `.damaged.1`, ... beside an earlier copy) and the stage redone. `dry_run`: only said."""
    path = Path(done)
    if not path.exists():
        return False
    if path.is_file() and path.suffix == ".json":
        try:
            read_json(path)
        except DamagedFile as exc:
            if dry_run:
                logger.info(f"{exc}; a run would move it aside and run its stage again")
                return False
            aside = move_aside(path, ".damaged")
            logger.info(f"{exc}; moved to {aside}, running its stage again")
            return False
    return True


def run_chain(name: str, overrides=(), only: list[str] | None = None,
              dry_run: bool = False) -> int:
    values, stages = load_chain(name, overrides)
    out = Path(values["out"])
    if dry_run:
        return _run_stages(name, values, stages, out, only, dry_run)
    claim_dir(out, "chain", resume=True)        # a rerun continues the chain
    lock = lock_dir(out, "chain")               # one chain at a time on one `out`
    try:
        return _run_stages(name, values, stages, out, only, dry_run)
    finally:
        lock.close()


def _run_stages(name: str, values: dict, stages: list[Stage], out: Path,
                only: list[str] | None, dry_run: bool) -> int:
    logs = out / "logs"
    if not dry_run:
        logs.mkdir(parents=True, exist_ok=True)
    wanted = set(only or [])
    unknown = wanted - {s.name for s in stages}
    if unknown:
        raise ConfigError(f"--only {sorted(unknown)}: not stages of {name} "
                          f"({[s.name for s in stages]})")
    for k, stage in enumerate(stages, start=1):
        head = f"chain {name} {k}/{len(stages)} {stage.name}"
        if wanted and stage.name not in wanted:
            continue
        if stage_done(stage.done, dry_run):
            logger.info(f"{head}: done ({stage.done})")
            continue
        cmd = [sys.executable, "-m", "peer_rl.cli", *stage.run]
        logger.info(redact_text(f"{head}: peer-rl {shlex.join(stage.run)}"))
        if dry_run:
            continue
        log = logs / f"{stage.name}.log"
        t0 = time.perf_counter()

        with open_append(log, binary=True) as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        took = time.perf_counter() - t0
        if rc or not stage_done(stage.done):
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            print("\n".join(tail), file=sys.stderr)
            logger.warning(f"{head}: failed (exit {rc}" + ("" if rc else f", but {stage.done} was "
                           "not written") + f") after {took:.0f} s; its log: {log}")
            return rc or 1
        logger.info(f"{head}: finished in {took:.0f} s")
    if not dry_run:            # from what is on disk: after --only, the rest shows as missing

        md = write_chain_report(values)
        logger.info(f"chain {name}: report {md}")
    return 0
