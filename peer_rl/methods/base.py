"""What a method is to the controller: an object built from the worker groups and its own
settings, with one call, `score(rows, step, timing) -> ScoredBatch` (a step's stages 2-5), and a
declaration of the pools it needs, which placement reads to decide what to start.

A method never sees the controller: the step it works for is an argument, G and the sampling
settings are read once from the config when it is built. Methods register by name
(`@register`); the one a run uses is the one its `reward_model.kind` names
(peer_rl.config.reward_kinds: RewardKind.method).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from peer_rl.config.reward_kinds import reward_kind
from peer_rl.errors import ConfigError
from peer_rl.protocol import SamplingConfig
from peer_rl.methods.scored_batch import ScoredBatch


@dataclass(frozen=True)
class Groups:
    """The worker groups (peer_rl.trainer.worker_group.WorkerGroup) a method calls; a pool the method
    did not declare is None."""
    rollout: object
    reward_model: object
    redundancy: object | None = None
    retrieval: object | None = None
    seeker: object | None = None       # the simulated seeker's engines (dialogue.enable)


@dataclass(frozen=True)
class Settings:
    """What every method reads from the run's config, once: G, the sampling, the seed, RUR."""
    n: int                     # rollout.n (G): samples per prompt
    seed: int                  # trainer.seed: with the step, every request's sampling seed
    sampling: SamplingConfig   # rollout.{temperature,top_p,response_length}
    rur: bool                  # algorithm.rur.enable

    @classmethod
    def from_config(cls, cfg) -> "Settings":
        r = cfg.rollout
        return cls(n=r.n, seed=cfg.trainer.seed, rur=cfg.algorithm.rur.enable,
                   sampling=SamplingConfig(n=r.n, temperature=r.temperature, top_p=r.top_p,
                                           max_tokens=r.response_length, seed=cfg.trainer.seed))


class Method(ABC):
    name: ClassVar[str]     # what a RewardKind's `method` names

    @classmethod
    def pools(cls, cfg) -> set[str]:
        """The pools this method calls with `cfg` (the policy's pool is always there)."""
        return {"rollout", "reward_model"} | ({"redundancy"} if cfg.algorithm.rur.enable
                                              else set())

    @classmethod
    @abstractmethod
    def from_config(cls, groups: Groups, cfg) -> "Method":
        """The method with its settings read from `cfg`."""

    @abstractmethod
    def score(self, rows: list[dict], step: int, timing, samples: list | None = None
              ) -> ScoredBatch:
        """Stages 2-5 of step `step` (1-based) for the prompt rows `rows`: rollout (skipped
        when `samples` are given), parsing, reward, RUR. No weights change here."""


_REGISTRY: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    if cls.name in _REGISTRY:
        raise ValueError(f"method {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def registered() -> dict[str, type[Method]]:
    return dict(_REGISTRY)


def method_class(cfg) -> type[Method]:
    """The registered method that scores with `reward_model.kind` (the kind names it); with
    dialogue.enable, training on whole conversations (peer_rl.methods.dialogue)."""
    if getattr(getattr(cfg, "dialogue", None), "enable", False):   # a plug-in's schema may lack it
        return _REGISTRY["dialogue"]
    kind = reward_kind(cfg.reward_model.kind)
    if kind.method not in _REGISTRY:
        raise ConfigError(f"reward_model.kind={kind.name!r} is scored by method "
                          f"{kind.method!r}, which is not registered; registered: "
                          f"{', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[kind.method]
