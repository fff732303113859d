"""The SmolLM2 policy and judge peer-rl ships as LoRA adapters (peer_rl/bundled/models/smollm2/):
the policy after `sft recipe=sft_smollm2` and the UnifiReward judge after `train-rm
recipe=unifireward_smollm2`, each an adapter of the pinned SmolLM2-135M-Instruct stored in
bfloat16 (~5 MB), with a manifest of the digests of what it was trained on (the same inputs the
shipped tiny models are checked by: the stage's worker config, the starting model, the data
tree, the rendered examples).

`peer-rl models use-smollm2 NAME --out DIR [key=value ...]` gives <DIR>/final: the shipped
adapter merged into the pinned base when the recipe with these overrides would train on exactly
those inputs, else the stage trained there (resume=auto). `peer-rl chain smollm2` starts with
it, so a fresh clone reaches GRPO without training the judge or the policy (23 and 6 minutes on
2 cores); `peer-rl models build-smollm2` trains both again and rewrites the shipped copy.
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
from datetime import date
from pathlib import Path

from peer_rl.files.out_paths import claim_dir, claim_run_dir, staged_dir
from peer_rl.supervised.config import load_supervised_config
from peer_rl.trainer.runtime import quiet_driver
from peer_rl.trainer.supervised_run import run_supervised
from peer_rl.trainer.tiny_cache import (MANIFEST, config_inputs, inputs_sha256, read_manifest,
                                        shipped_model, swap_in)

log = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "bundled" / "models" / "smollm2"
STAGES = {"judge": ("rm", "unifireward_smollm2"), "policy": ("sft", "sft_smollm2")}
BUILD_COMMAND = "peer-rl models build-smollm2"
BUILT_BY = "models build-smollm2"       # its output marker (peer_rl.files.out_paths)
ADAPTER = "adapter_model.safetensors"
SHIPPED_FROM = "shipped_from.json"      # in a final/ made from a shipped adapter


def stage_config(name: str, overrides=(), stages=None):
    """(the supervised config of shipped model `name`'s recipe with `overrides`, its kind)."""
    stages = stages or STAGES
    if name not in stages:
        raise ValueError(f"{name!r}: expected one of {sorted(stages)}")
    kind, recipe = stages[name]
    return load_supervised_config([f"recipe={recipe}", *overrides], kind), kind


def use_shipped(name: str, out_dir: str | Path, overrides=(), shipped_dir: Path | None = None,
                stages=None) -> Path:
    """<out_dir>/final for shipped model `name`: its adapter merged into the starting model when
    the stage would train on exactly the inputs it was trained on, else the stage run there."""
    shipped_dir = Path(shipped_dir or SHIPPED_DIR)
    out_dir = Path(out_dir).resolve()
    cfg, kind = stage_config(name, [*overrides, f"trainer.output_dir={out_dir}"], stages)
    # the stage's own output directory (sft / train-rm may continue it): checked before any work
    command, inputs = ("sft" if kind == "sft" else "train-rm"), [cfg.data.root, cfg.model.path,
                                                                 shipped_dir]
    claim_dir(out_dir, command, inputs, resume=True, create=False, flag="--out")
    final = out_dir / "final"
    if (final / "config.json").exists():
        log.info(f"{final} already holds the {name}; remove it to make it again")
        return final
    path, why = shipped_model(name, config_inputs(cfg, kind), shipped_dir, label="SmolLM2",
                              build=BUILD_COMMAND, needs=ADAPTER)
    if not path:
        log.info(f"{why}: training the {name} (recipe={cfg.recipe}) in {out_dir}")
        return run_supervised(cfg, kind)
    manifest = read_manifest(shipped_dir, BUILD_COMMAND)
    if not cfg.logging.verbose:
        quiet_driver()          # no weight-loading bars: the stage's own line says what it did
    lock = claim_run_dir(out_dir, command, inputs)
    try:
        materialize(Path(path), cfg.model.path, final, manifest, name)
    finally:
        lock.close()
    log.info(f"{name}: the adapter shipped with peer-rl (built {manifest.get('built', '?')} by "
             f"`{BUILD_COMMAND}`; recipe {cfg.recipe}, its inputs match) merged into "
             f"{cfg.model.path} -> {final}")
    return final


def materialize(adapter_dir: Path, base: str, final: Path, manifest: dict, name: str) -> Path:
    """`final` as a supervised stage writes it: the base with the adapter merged (float32),
    adapter/, the templates and card saved beside it, trainer_state.json; written beside and
    swapped in whole."""
    from peft import PeftModel  # deferred: peft (pulls in torch and transformers)

    from peer_rl.workers.fsdp import copy_model_files, load_pretrained  # deferred: pulls in torch

    entry = manifest["models"][name]
    with staged_dir(final) as tmp:
        copy_model_files(base, tmp)
        # PEFT loads a bfloat16 adapter into float32 (autocast_adapter_dtype) and merges W + s B A
        merged = PeftModel.from_pretrained(load_pretrained(base),
                                           str(adapter_dir)).merge_and_unload()
        merged.save_pretrained(tmp, safe_serialization=True)
        shutil.copytree(adapter_dir, tmp / "adapter")
        for f in adapter_dir.iterdir():          # the prompt templates and the card
            if f.suffix == ".json" and not f.name.startswith("adapter_"):
                shutil.copy2(f, tmp / f.name)
        (tmp / "trainer_state.json").write_text(json.dumps(
            {"step": entry["steps"], "loss": entry["final_loss"]}, indent=1), encoding="utf-8")
        (tmp / SHIPPED_FROM).write_text(json.dumps(
            {"adapter": str(adapter_dir), "built": manifest.get("built"),
             "inputs_sha256": entry["inputs_sha256"]}, indent=1), encoding="utf-8")
    return final


def ship_adapter(trained_adapter: Path, dest: Path) -> None:
    """A trained adapter/ as peer-rl ships it: the weights in bfloat16 (half the bytes; the merged
    weights move by the rounding of B and A, ~0.4% of the adapter's own change)."""
    from safetensors.torch import load_file, save_file  # deferred: safetensors (pulls in torch)
    import torch  # deferred: torch (~2 s); the CLI starts without it

    dest.mkdir(parents=True)
    for f in trained_adapter.iterdir():
        if f.name == ADAPTER:
            state = {k: v.to(torch.bfloat16) for k, v in load_file(str(f)).items()}
            save_file(state, str(dest / ADAPTER), metadata={"format": "pt"})
        elif f.suffix == ".json":
            shutil.copy2(f, dest / f.name)
    config = json.loads((dest / "adapter_config.json").read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = ""      # a machine's path: the base is given at use
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def build_shipped_adapters(out_dir: str | Path = SHIPPED_DIR, overrides=(), stages=None,
                           ray_address: str = "") -> Path:
    """Train every stage of `stages` by its recipe (+ overrides) and write the adapters with a
    manifest of their inputs' digests to out_dir (replaced whole once all are trained)."""
    import torch  # deferred: torch (~2 s); the CLI starts without it
    import transformers  # deferred: transformers (~3 s, pulls in torch)

    stages = stages or STAGES
    out_dir = Path(out_dir).resolve()
    manifest = {"built": date.today().isoformat(), "command": BUILD_COMMAND,
                "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                "models": {}}
    ray = [f"ray.address={ray_address}"] if ray_address else []
    with tempfile.TemporaryDirectory(prefix="peer-rl-build-adapters-") as tmp:
        staging = Path(tmp) / "out"
        for name in stages:
            cfg, kind = stage_config(name, [*overrides, *ray,
                                            f"trainer.output_dir={tmp}/trained/{name}"], stages)
            if not cfg.model.lora.rank:
                raise ValueError(f"recipe {cfg.recipe}: model.lora.rank is 0; a shipped adapter "
                                 "needs a LoRA stage")
            inputs = config_inputs(cfg, kind)
            final = run_supervised(cfg, kind)
            ship_adapter(final / "adapter", staging / name)
            state = json.loads((final / "trainer_state.json").read_text(encoding="utf-8"))
            manifest["models"][name] = {"kind": kind, "recipe": cfg.recipe,
                                        "steps": state["step"],
                                        "final_loss": round(state["loss"], 4),
                                        "inputs": inputs, "inputs_sha256": inputs_sha256(inputs)}
        swap_in(staging, out_dir, manifest, BUILT_BY)
    log.info(f"{', '.join(stages)} adapters written to {out_dir} ({MANIFEST})")
    return out_dir
