"""The verl plug-in's settings (`reward.reward_kwargs` of a verl config), apart from verl.

peer_rl.integrations.verl_reward imports verl and runs only in a verl environment; this module
needs omegaconf alone, so how a verl config becomes the manager's settings (and which values it
refuses) is tested in peer-rl's own environment. The judge's and RUR's defaults are peer-rl's
own (peer_rl.config.worker_settings), written once.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from omegaconf import MISSING, OmegaConf

from peer_rl.config.worker_settings import (
    REDUNDANCY_CHOICES,
    JudgeSettings,
    RedundancySettings,
    RewardWeights,
)


@dataclass
class PeerRewardSettings:
    """`reward.reward_kwargs` of a verl config (a misspelt key fails at start-up, named)."""
    judge_path: str = MISSING            # the judge directory: judge_template.json, tokenizer
    judge_url: str | None = None         # OpenAI-compatible base URL; None: verl's reward model
    judge_model: str | None = None       # served name; None: the server's only model
    max_model_len: int | None = None     # judge context; None: the server's (/v1/models)
    max_tokens: int = JudgeSettings.max_tokens
    request_timeout_s: float = 120.0
    retries: int = 3                     # attempts per judge request (connection, 5xx, a
                                         # malformed body) before JudgeUnreachable
    seed: int = 0                        # the candidate-position coin
    rur: bool = True                     # PEER-RUR; false: PEER
    group_size: int | None = None        # None: rollout.n; val_kwargs.n for validation rows
    group_timeout_s: float = 60.0        # a group waits this long after its latest reply
    redundancy: RedundancySettings = field(default_factory=RedundancySettings)
    # PEER's reward weights (step, preference, format), as peer-rl's reward_model.weights
    weights: RewardWeights = field(default_factory=RewardWeights)

    @classmethod
    def from_verl(cls, config) -> "PeerRewardSettings":
        kwargs = OmegaConf.select(config, "reward.reward_kwargs", default=None)
        if kwargs is None:
            raise ValueError("reward.reward_kwargs is not set: the PEER reward manager needs at "
                             "least +reward.reward_kwargs.judge_path=<judge directory>")
        try:
            merged = OmegaConf.merge(OmegaConf.structured(cls), kwargs)
            settings = OmegaConf.to_object(merged)
        except Exception as exc:     # omegaconf names the key and the expected type
            raise ValueError(f"reward.reward_kwargs: {exc}") from exc
        for key, allowed in REDUNDANCY_CHOICES.items():
            value = getattr(settings.redundancy, key)
            if value not in allowed:
                raise ValueError(f"reward.reward_kwargs.redundancy.{key}={value!r}: expected one "
                                 f"of {allowed}")
        for f in fields(RewardWeights):
            value = getattr(settings.weights, f.name)
            if value < 0:
                raise ValueError(f"reward.reward_kwargs.weights.{f.name}={value}: expected a "
                                 "value >= 0")
        return settings
