"""How the policy's weights train and where its reference comes from: full weights with a
sharded reference copy, or LoRA adapters (PEFT) with the reference as the same model with its
adapters switched off (verl's ref_in_actor).

workers/policy.py holds one of two objects with the same small interface and never asks which:
- FullWeights: every parameter trains; the reference is a second sharded copy of the initial
  policy; state dicts are already in Hugging Face names.
- Adapters: `peft` injects LoRA layers into the HF model before FSDP2 shards it (so the model
  keeps its class, its parameter names outside the adapted layers and its vision tower); only
  the adapters require grad (and so only they reach the optimizer); the vision tower and its
  aligners are neither adapted nor trained. Whatever leaves the worker as plain weights (weight
  sync, export, full_state) is merged on the fly: W + (lora_alpha / r) B A for each adapted layer.
"""
from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from peer_rl.config.worker_settings import LoRASettings, lora_merged
from peer_rl.workers import fsdp
from peer_rl.workers.devices import use_cuda

ADAPTER = "default"           # PEFT's name for a model's one adapter
KEY = "model.lora"            # the config section errors name
PEFT_PREFIX = "base_model.model."   # PeftModel's names around the HF model's


class FullWeights:
    """Full fine-tuning: the model as loaded, a separate frozen reference."""

    on, rank = False, 0

    def wrap(self, model):
        return model

    def reference(self, load_copy: Callable[[], torch.nn.Module], world_size: int):
        """A second sharded copy of the initial policy (GRPO's KL anchor never moves)."""
        return load_copy(), ""

    def hf_state(self, sd: dict) -> dict:
        return sd

    def param_name(self, hf_name: str) -> str:
        return hf_name

    def sync_pairs(self, full_pairs: Callable[[], list], names: list[str]) -> list[tuple[str, str]]:
        """(module tensor, name the engines load it by) of each tensor a weight sync sends:
        every weight (`full_pairs()`); `names`: the model's parameter names."""
        return full_pairs()

    def adapter_config(self) -> str | None:
        """adapter_config.json's text when the engines serve base + adapter (a sync then
        sends the adapters only); None when they load plain weights."""
        return None

    def full_tensor(self, tensors: dict, hf_name: str, gather) -> torch.Tensor:
        return gather(tensors[hf_name])

    # which module tensors the sharded checkpoint holds (what training changes): None = all
    in_checkpoint = None

    def save_adapter(self, sd: dict, directory: Path) -> None:
        """Exports of full weights have no adapter."""

    def check_checkpoint(self, dcp_dir: Path) -> None:
        """A sharded checkpoint holds full weights or adapters of one rank: resuming it under
        another model.lora.rank fails here, naming the key, not deep inside the loader."""
        state = Path(dcp_dir) / fsdp.SHARDED_STATE
        if not state.is_file():
            return                            # the loader names what is missing
        saved = int(json.loads(state.read_text(encoding="utf-8"))["extra"].get("lora_rank", 0))
        if saved != self.rank:
            what = f"LoRA adapters of rank {saved}" if saved else "full weights"
            raise ValueError(f"{dcp_dir.parent}: the checkpoint holds {what}, but "
                             f"{KEY}.rank={self.rank}: resume with {KEY}.rank={saved}")


class Adapters(FullWeights):
    """LoRA adapters of `settings` on the policy (model.lora.rank > 0)."""

    on = True

    def __init__(self, settings: LoRASettings, model_path: str):
        self.settings, self.model_path, self.rank = settings, model_path, settings.rank
        self.peft = None
        self.scaling: dict[str, float] = {}   # HF weight name of an adapted layer -> alpha / r

    # ---------------------------------------------------------------- building
    def wrap(self, model):
        """Inject the adapters into `model` in place (before sharding) and return it: every
        base parameter frozen, the adapters trainable. A target that names nothing, or a model
        with no layer to adapt, fails here, naming the key."""
        from peft import LoraConfig, get_peft_model  # deferred: peft
        from peft.tuners.tuners_utils import NoMatchingPeftModuleError  # deferred: peft

        s = self.settings
        tower = fsdp.vision_tower(model)
        # the tower and everything in it, as a regular expression PEFT full-matches
        exclude = next((rf"{re.escape(n)}(\..*)?" for n, m in model.named_modules()
                        if tower is not None and m is tower), None)
        targets = list(s.target_modules)
        # task_type: PEFT then records no base-model class (here an FSDP subclass) on save
        config = LoraConfig(r=s.rank, lora_alpha=s.lora_alpha, lora_dropout=0.0,
                            target_modules=targets[0] if targets == ["all-linear"] else targets,
                            exclude_modules=exclude, bias="none", task_type="CAUSAL_LM")
        try:
            self.peft = (self._load_adapter(model) if s.lora_adapter_path
                         else get_peft_model(model, config))
        except NoMatchingPeftModuleError as exc:
            raise ValueError(f"{KEY}.target_modules={targets}: no layer of {self.model_path} to "
                             f"adapt with {KEY}.rank={s.rank} (PEFT: "
                             f"{str(exc).splitlines()[0].split('. ')[0]})") from None
        self._index(model)
        return model

    def check_saved(self) -> None:
        """model.lora.lora_adapter_path holds a PEFT adapter of model.lora.rank."""
        from peft import PeftConfig  # deferred: peft (pulls in torch and transformers)

        s, path = self.settings, Path(self.settings.lora_adapter_path)
        if not (path / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{KEY}.lora_adapter_path={str(path)!r}: no "
                                    "adapter_config.json there (expected a PEFT adapter directory)")
        saved = PeftConfig.from_pretrained(str(path))
        if saved.r != s.rank:
            raise ValueError(f"{KEY}.lora_adapter_path={str(path)!r} holds an adapter of rank "
                             f"{saved.r}, but {KEY}.rank={s.rank}: set {KEY}.rank={saved.r}")

    def _load_adapter(self, model):
        """model.lora.lora_adapter_path: a PEFT adapter directory, trained further."""
        from peft import PeftModel  # deferred: peft (pulls in torch and transformers)

        self.check_saved()
        return PeftModel.from_pretrained(model, str(self.settings.lora_adapter_path),
                                         is_trainable=True)

    def _index(self, model) -> None:
        """The adapted layers by the HF name of their weight; only plain linear layers (their
        merge is W + s B A), and never an output layer tied to the embeddings."""
        from peft.tuners.lora import Linear as LoRALinear  # deferred: peft
        from peft.tuners.lora import LoraLayer  # deferred: peft (pulls in torch and transformers)

        tied = fsdp.tied_duplicates(model)
        tied_names = {n.replace(".base_layer.", ".") for n in (*tied, *tied.values())}
        tower = fsdp.vision_tower(model)
        inside = {id(m) for m in tower.modules()} if tower is not None else set()
        for name, mod in model.named_modules():
            if not isinstance(mod, LoraLayer):
                continue
            if id(mod) in inside:             # an adapter saved without the tower excluded
                raise ValueError(f"{KEY}.lora_adapter_path={self.settings.lora_adapter_path!r}"
                                 f" adapts {name} in the vision tower, which stays untouched")
            hf = f"{name}.weight"
            if not isinstance(mod, LoRALinear) or getattr(mod, "fan_in_fan_out", False):
                kind = type(mod.base_layer).__name__
                raise ValueError(f"{KEY}.target_modules: {name} is a {kind}; only linear "
                                 "layers can be adapted here")
            if hf in tied_names:
                raise ValueError(f"{KEY}.target_modules: {name} shares its weight with the "
                                 "embeddings (tied); leave it out")
            self.scaling[hf] = float(mod.scaling[ADAPTER])

    def reference(self, load_copy, world_size: int):
        """No second copy: the policy itself, its adapters off for the reference's forwards."""
        model = self.peft.get_base_model()
        base = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                   if "lora_" not in n)
        line = (f"reference: the policy with its LoRA adapters off ({KEY}.rank="
                f"{self.settings.rank}; no second copy, {base / world_size / 2**20:.1f} MiB of "
                "weights a rank not held)")
        return AdaptersOff(self.peft, model), line

    # ---------------------------------------------------------------- plain weights out
    def param_name(self, hf_name: str) -> str:
        """The module tensor behind an HF name (an adapted layer's weight and bias live in its
        base_layer)."""
        module, _, leaf = hf_name.rpartition(".")
        return f"{module}.base_layer.{leaf}" if f"{module}.weight" in self.scaling else hf_name

    def sync_pairs(self, full_pairs, names):
        """Engines serving base + adapter: the adapters alone, by the names PEFT saves them
        under (what vLLM's LoRA loader reads); merged: every weight, merged as it is gathered.
        model.lora.merge "auto" is resolved by the placement layer; here, by this process's
        device (a worker built directly)."""
        if self._merged():
            return full_pairs()
        return [(n, PEFT_PREFIX + re.sub(rf"\.(lora_[AB])\.{ADAPTER}\.", r".\1.", n))
                for n in names if ".lora_" in n]

    def adapter_config(self) -> str | None:
        """PEFT's own adapter_config.json for this adapter, written by PEFT (so vLLM reads
        exactly what `save_adapter` would write)."""
        if self._merged():
            return None
        if not hasattr(self, "_config_text"):
            with tempfile.TemporaryDirectory(prefix="peer-rl-adapter-config-") as d:
                self.peft.peft_config[ADAPTER].save_pretrained(d)
                self._config_text = (Path(d) / "adapter_config.json").read_text(encoding="utf-8")
        return self._config_text

    def _merged(self) -> bool:
        return lora_merged(self.settings, use_cuda())

    def _delta(self, hf_name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (b.float() @ a.float()) * self.scaling[hf_name]

    def hf_state(self, sd: dict) -> dict:
        """A full state dict of the adapted model -> HF names, adapters merged."""
        out = {}
        for k, v in sd.items():
            if ".lora_" in k:
                continue
            hf = k.replace(".base_layer.", ".")
            if hf in self.scaling:
                module = hf[:-len(".weight")]
                v = (v.float() + self._delta(hf, sd[f"{module}.lora_A.{ADAPTER}.weight"],
                                             sd[f"{module}.lora_B.{ADAPTER}.weight"])).to(v.dtype)
            out[hf] = v
        return out

    def full_tensor(self, tensors: dict, hf_name: str, gather) -> torch.Tensor:
        """One tensor as the engines load it: an adapted weight gathered with its A and B and
        merged (the engines need no LoRA support)."""
        w = gather(tensors[self.param_name(hf_name)])
        if hf_name not in self.scaling:
            return w
        module = hf_name[:-len(".weight")]
        a = gather(tensors[f"{module}.lora_A.{ADAPTER}.weight"])
        b = gather(tensors[f"{module}.lora_B.{ADAPTER}.weight"])
        return (w.float() + self._delta(hf_name, a, b)).to(w.dtype)


    # ---------------------------------------------------------------- checkpoints
    def in_checkpoint(self, name: str) -> bool:
        """Only the adapters: the base weights never change and are read from model.path."""
        return ".lora_" in name

    def save_adapter(self, sd: dict, directory: Path) -> None:
        """The adapters of a full state dict in PEFT's own format (adapter_config.json +
        adapter_model.safetensors): what PeftModel.from_pretrained, vLLM's LoRARequest and
        model.lora.lora_adapter_path read."""
        state = {f"{PEFT_PREFIX}{k}": v for k, v in sd.items() if ".lora_" in k}
        self.peft.save_pretrained(str(directory), state_dict=state)


class AdaptersOff:
    """The reference policy: calls run the adapted model inside PEFT's disable_adapter(), so
    every LoRA layer computes its base layer alone; other attributes are the model's."""

    def __init__(self, peft_model, model):
        self._peft, self._model = peft_model, model

    def __call__(self, *args, **kwargs):
        with self._peft.disable_adapter():
            return self._model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


def check_settings(settings: LoRASettings, model_path: str) -> None:
    """model.lora against the model at `model_path` as the policy will wrap it, on its module
    tree alone (fsdp.build_empty: config.json on the meta device, no weight read; seconds,
    mostly PEFT's imports): a target that names no layer, names a layer that is not linear or one tied to the
    embeddings, or a saved adapter of another rank fails here, naming the key, rather than in a
    policy rank after the pools have started. `peer-rl train` calls it before Ray starts."""
    adapters = Adapters(settings, model_path)
    if settings.lora_adapter_path:           # the saved adapter names its own targets
        adapters.check_saved()
        return
    adapters.wrap(fsdp.build_empty(model_path))


def policy_weights(settings: LoRASettings | None, model_path: str) -> FullWeights:
    """What the policy worker trains: Adapters for model.lora.rank > 0, else FullWeights."""
    if settings is None or not settings.rank:
        return FullWeights()
    return Adapters(settings, model_path)
