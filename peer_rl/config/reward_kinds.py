"""The reward-model kinds a run may name (`reward_model.kind`), registered by name: each one
declares, once, what every part of a run asks of it, so no part compares kind names.

- which method scores with it (`method`, a name in peer_rl.methods' registry);
- which worker class serves the reward_model pool (`worker`) and the models each engine loads
  (`models`, reward_model keys in the worker's argument order);
- whether it writes verdicts (`judge_roles`: the role each model's judge_template.json names; a
  kind without them only scores, so it cannot judge the in-training safety probes);
- how the policy is asked (`style`, one of peer_rl.evaluation.supporter's styles), which decides
  the tiny models a run without paths trains, the prompts measured before the pools start and
  how the in-training evaluation asks the policy;
- what it allows: an adapter (reward_model.lora_path), retrieval (retrieval.enable), empty
  model paths (`tiny`: the cached tiny model stands in).

They sit in the config room, below the methods, because the config checks them at load; a
plug-in registers its kind here and its method in peer_rl.methods (docs/architecture.md,
"Method plug-ins")."""
from __future__ import annotations

from dataclasses import dataclass

from peer_rl.errors import ConfigError


@dataclass(frozen=True)
class RewardKind:
    name: str                            # the reward_model.kind value
    method: str                          # the registered method that scores with it
    worker: str                          # the reward_model pool's worker class, "module:Class"
    # "peer": the policy answers its rows' own Steps 1-4 instruction; "escrag": it writes
    # <think>...</think> then the reply, in prompts the method builds
    style: str
    models: tuple[str, ...] = ("path",)  # reward_model keys of the models an engine loads
    judge_roles: tuple[str, ...] = ()    # per model, the judge template's role; () = scores only
    tiny: bool = True                    # an empty reward_model.path is the cached tiny model
    lora_adapter: bool = False           # its engines serve reward_model.lora_path
    retrieval: bool = False              # it scores ESCRAG-R1's refined replies: retrieval.enable

    @property
    def writes(self) -> bool:
        """A generative judge: it writes verdicts (the safety probes need one)."""
        return bool(self.judge_roles)

    @property
    def rows_prompt(self) -> bool:
        """The policy is asked with its rows' own messages, whose lengths are known before a
        step; otherwise the method builds the prompts."""
        return self.style == "peer"


_KINDS: dict[str, RewardKind] = {}


def register_kind(kind: RewardKind) -> RewardKind:
    if kind.name in _KINDS:
        raise ValueError(f"reward_model.kind {kind.name!r} registered twice")
    _KINDS[kind.name] = kind
    return kind


def registered_kinds() -> tuple[str, ...]:
    """The names, in registration order (the built-in ones first)."""
    return tuple(_KINDS)


def reward_kind(name: str) -> RewardKind:
    """The registered kind `name`; an unknown one is a ConfigError naming those registered."""
    if name not in _KINDS:
        raise ConfigError(f"reward_model.kind={name!r}: expected one of {registered_kinds()}")
    return _KINDS[name]


# PEER: UnifiReward, one generative judge answering the four rounds
register_kind(RewardKind("unifireward", method="peer", style="peer",
                         worker="peer_rl.workers.unifireward:UnifiRewardWorker",
                         judge_roles=("unified",), lora_adapter=True))
# ESCRAG-R1: a Bradley-Terry sequence-classification model on vLLM's pooling runner
register_kind(RewardKind("scalar", method="escrag_r1", style="escrag",
                         worker="peer_rl.workers.scalar_reward:ScalarRewardWorker",
                         retrieval=True))
# PEER's baseline: a process model and an outcome model (`train-rm recipe=prm|orm`), both set
register_kind(RewardKind("prm_orm", method="peer", style="peer",
                         worker="peer_rl.workers.unifireward:PairRewardWorker",
                         models=("path", "outcome_path"), judge_roles=("process", "outcome"),
                         tiny=False))
