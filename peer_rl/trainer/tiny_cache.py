"""The tiny trained models the default runs use: the tiny judge after `train-rm` and the tiny
policy after `sft` (shipped with peer-rl, checked against the inputs this code would train them
on, else trained once into <cache_dir>/trained/), ESCRAG-R1's tiny reward model and cold-start
policy (trained once into <cache_dir>/trained/ and reused)."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import shutil
import tempfile
from datetime import date
from importlib.metadata import version
from pathlib import Path

from peer_rl import recipes, workers
from peer_rl.files.out_paths import DamagedFile, read_json, staged_dir, write_atomic
from peer_rl.supervised.config import load_supervised_config
from peer_rl.trainer.supervised_run import run_supervised

log = logging.getLogger(__name__)


def ensure_trained_tiny_reward_model(cache_dir: str | Path, ray_address: str = "") -> str:
    """The tiny scalar reward model after `train-rm recipe=escrag_rm_tiny` (Bradley-Terry on the
    sample's preference pairs), trained once into <cache_dir>/trained/reward and reused."""
    run_dir = Path(cache_dir) / "trained" / "reward"
    final = run_dir / "final"
    if not (final / "config.json").exists():
        log.info(f"first run: training the tiny scalar reward model once (train-rm "
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
    run_dir = Path(cache_dir) / "trained" / "escrag_policy"
    final = run_dir / "final"
    if not (final / "config.json").exists():
        start = ensure_trained_tiny_models(cache_dir, ray_address)["policy"]
        log.info(f"first run: the tiny policy's cold-start SFT on the <think> format once (sft "
                 f"recipe=escrag_sft_tiny, ~1.5 minutes on 2 cores; cached in {run_dir})")
        over = ["recipe=escrag_sft_tiny", f"model.path={start}", f"trainer.output_dir={run_dir}"]
        cfg = load_supervised_config(over + ([f"ray.address={ray_address}"] if ray_address
                                             else []), "sft")
        run_supervised(cfg, "sft")
    return str(final)


SHIPPED_DIR = Path(__file__).resolve().parents[1] / "bundled" / "models" / "tiny"
MANIFEST = "manifest.json"
STAGES = (("judge", "rm"), ("policy", "sft"))   # each trained by its kind's default recipe
BUILD_COMMAND = "peer-rl models build-tiny"
BUILT_BY = "models build-tiny"          # its output marker (peer_rl.files.out_paths)


def _hash_files(h, root: Path, pattern: str = "*"):
    """Feed h every file under root matching pattern: its relative path, then its bytes."""
    for f in sorted(p for p in Path(root).rglob(pattern) if p.is_file()):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h


def _tree_sha256(root: Path) -> str:
    return _hash_files(hashlib.sha256(), root).hexdigest()


# what makes a starting model: its weights, vocabulary and architecture (config.json less the
# transformers version that wrote it); tokenizer_config.json also records how it was loaded
# (local_files_only), which differs from machine to machine
_MODEL_FILES = ("model.safetensors", "tokenizer.json", "config.json")


def _model_sha256(model_dir: Path) -> str:
    h = hashlib.sha256()
    for name in _MODEL_FILES:
        data = (Path(model_dir) / name).read_bytes()
        if name == "config.json":
            config = json.loads(data)
            config.pop("transformers_version", None)
            data = json.dumps(config, sort_keys=True).encode()
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def stage_inputs(cache_dir: str | Path, kind: str) -> dict[str, str]:
    """Digests of everything training the tiny model of `kind` learns from: the worker config
    (recipe, steps, learning rate, seed, files, the template saved beside the model), the
    starting random model, the data tree's bytes and the token ids and labels the current code
    renders from it. Paths and machine settings are left out, so the same inputs give the
    same digests on any machine."""
    return config_inputs(load_supervised_config([f"model.tiny_cache_dir={cache_dir}"], kind),
                         kind)


def config_inputs(cfg, kind: str) -> dict[str, str]:
    """stage_inputs of a loaded supervised config (any recipe, any starting model)."""
    from peer_rl.trainer.supervised_run import plan_stage  # deferred: tests patch plan_stage

    with contextlib.redirect_stdout(io.StringIO()):     # the stage's own log lines, not ours
        plan = plan_stage(cfg, kind)
    learned = plan.worker.training_inputs()
    return {"config": hashlib.sha256(json.dumps(learned, sort_keys=True).encode()).hexdigest(),
            "start_model": _model_sha256(Path(plan.model_path)),
            "data": _tree_sha256(plan.root), "examples": plan.examples_sha256}


def _code_and_data_key(kind: str) -> str:
    """A digest of everything stage_inputs reads: peer-rl's code, recipes and bundled data and
    the installed torch / transformers (which build the starting model and tokenize)."""
    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(f"{kind} torch {version('torch')} transformers "
                       f"{version('transformers')}".encode())
    for root, pattern in ((pkg, "*.py"), (Path(workers.__file__).parent, "*.py"),
                          (Path(recipes.__file__).parent, "*.yaml"),
                          (pkg / "bundled" / "data", "*")):
        _hash_files(h, root, pattern)
    return h.hexdigest()


def remembered_stage_inputs(cache_dir: str | Path, kind: str) -> dict[str, str]:
    """stage_inputs, worked out once per version of peer-rl's code and data and kept in
    <cache_dir>/inputs/ (it reads every training row through the tokenizer: seconds a run)."""
    memo = Path(cache_dir) / "inputs" / f"{_code_and_data_key(kind)[:24]}.json"
    if memo.exists():
        try:
            return read_json(memo)
        except DamagedFile:            # cut short: worked out again and rewritten whole
            pass
    inputs = stage_inputs(cache_dir, kind)
    write_atomic(memo, json.dumps(inputs))
    return inputs


def inputs_sha256(inputs: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def read_manifest(shipped_dir: Path | None = None, build: str = BUILD_COMMAND) -> dict:
    path = Path(shipped_dir or SHIPPED_DIR) / MANIFEST
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        for entry in manifest.get("models", {}).values():
            entry["inputs"]            # every model's entry carries its inputs' digests
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a manifest of shipped models ({exc!r}); restore it "
                         f"from the repository or rebuild with `{build}`") from exc
    return manifest


def file_digests(model_dir: Path) -> dict[str, str]:
    """sha256 of every file under a shipped model's directory, by relative path."""
    return {str(f.relative_to(model_dir)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(model_dir.rglob("*")) if f.is_file()}


def check_files(model: Path, entry: dict, build: str) -> None:
    """A shipped model's files are the ones its manifest lists (an install or a copy can damage
    them; a damaged weight file would otherwise fail deep inside the loader)."""
    want = entry.get("files")
    if not want:                 # a manifest from before the digests: nothing to hold against
        return
    got = file_digests(model)
    bad = sorted(f for f in want if got.get(f) != want[f])
    if bad:
        what = ", ".join(f"{f} ({'missing' if f not in got else 'differs'})" for f in bad)
        raise ValueError(f"{model}: the shipped files {what} are not the ones its manifest "
                         f"({MANIFEST}) lists: reinstall peer-rl, or rebuild them with `{build}`")


def shipped_model(name: str, inputs: dict[str, str], shipped_dir: Path | None = None,
                  label: str = "tiny", build: str = BUILD_COMMAND, needs: str = "config.json"
                  ) -> tuple[str | None, str]:
    """(path, "") when the shipped `label` `name` (its directory holding `needs`) was trained
    on exactly these inputs, else (None, why not)."""
    shipped_dir = Path(shipped_dir or SHIPPED_DIR)
    entry = read_manifest(shipped_dir, build).get("models", {}).get(name)
    model = Path(shipped_dir) / name
    if not entry or not (model / needs).exists():
        return None, f"no shipped {label} {name} in {shipped_dir}"
    differ = [k for k in sorted(inputs) if entry["inputs"].get(k) != inputs[k]]
    if differ:
        return None, (f"the shipped {label} {name} was trained on other inputs ({', '.join(differ)}"
                      f" differ; `{build}` rebuilds it)")
    check_files(model, entry, build)
    return str(model), ""


def ensure_trained_tiny_models(cache_dir: str | Path, ray_address: str = "") -> dict[str, str]:
    """The tiny judge after `peer-rl train-rm` and the tiny policy after `peer-rl sft` (their
    default recipes, on the bundled sample).

    A random judge answers nothing parseable and a random policy writes no Step markers, so a
    GRPO run between them shows reward 0 on every step; these have learned the formats, which
    is what the default `peer-rl train` starts from. peer-rl ships both (~4 MB each, built by
    `peer-rl models build-tiny`) with the digests of what they were trained on; when the
    current recipes, data, templates or example rendering differ, the model is trained once
    into <cache_dir>/trained/<name>-<digest> instead (an interrupted build resumes: Ray Train's
    own resume on the same output directory)."""
    out = {}
    for name, kind in STAGES:
        inputs = remembered_stage_inputs(cache_dir, kind)
        path, why = shipped_model(name, inputs)
        if path:
            out[name] = path
            continue
        run_dir = Path(cache_dir) / "trained" / f"{name}-{inputs_sha256(inputs)[:12]}"
        final = run_dir / "final"
        if not (final / "config.json").exists():
            log.info(f"first run: {why}; training the tiny {name} once "
                     f"({'train-rm' if kind == 'rm' else 'sft'}, ~2-3 minutes on 2 cores; cached "
                     f"in {run_dir})")
            over = [f"trainer.output_dir={run_dir}", f"model.tiny_cache_dir={cache_dir}"]
            cfg = load_supervised_config(over + ([f"ray.address={ray_address}"] if ray_address
                                                 else []), kind)
            run_supervised(cfg, kind)
        out[name] = str(final)
    if all(Path(p).parent == SHIPPED_DIR for p in out.values()):
        built = read_manifest().get("built", "?")
        log.info(f"tiny judge and policy: the trained ones shipped with peer-rl (built {built} by "
                 f"`{BUILD_COMMAND}`; their recipes, data and examples match this code's)")
    return out


def build_shipped_tiny_models(out_dir: str | Path = SHIPPED_DIR, ray_address: str = "") -> Path:
    """Train the tiny judge and policy from freshly built random models by their default recipes
    and write them, with a manifest of their inputs' digests, to out_dir (replaced whole only
    once both are trained)."""
    import torch  # deferred: torch (~2 s); the CLI starts without it
    import transformers  # deferred: transformers (~3 s, pulls in torch)

    out_dir = Path(out_dir).resolve()
    manifest = {"built": date.today().isoformat(), "command": BUILD_COMMAND,
                "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                "models": {}}
    with tempfile.TemporaryDirectory(prefix="peer-rl-build-tiny-") as tmp:
        staging = Path(tmp) / "out"
        for name, kind in STAGES:
            inputs = stage_inputs(tmp, kind)
            over = [f"trainer.output_dir={tmp}/trained/{name}", f"model.tiny_cache_dir={tmp}"]
            cfg = load_supervised_config(over + ([f"ray.address={ray_address}"] if ray_address
                                                 else []), kind)
            final = run_supervised(cfg, kind)
            shutil.copytree(final, staging / name)
            state = json.loads((final / "trainer_state.json").read_text(encoding="utf-8"))
            manifest["models"][name] = {"kind": kind, "recipe": cfg.recipe, "steps": state["step"],
                                        "final_loss": round(state["loss"], 4),
                                        "inputs": inputs, "inputs_sha256": inputs_sha256(inputs)}
        swap_in(staging, out_dir, manifest, BUILT_BY)
    log.info(f"tiny judge and policy written to {out_dir}")
    return out_dir


def swap_in(staging: Path, out_dir: Path, manifest: dict, built_by: str) -> None:
    """`staging` with its manifest becomes `out_dir`: copied into a directory made beside it,
    then swapped in (peer_rl.files.out_paths.staged_dir), so a reader never meets a
    half-written copy; files of the earlier `out_dir` that the build did not write stay."""
    for name, entry in manifest["models"].items():
        entry["files"] = file_digests(staging / name)
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    with staged_dir(out_dir, command=built_by) as new:   # marked: what a later build may replace
        shutil.copytree(staging, new, dirs_exist_ok=True)
