"""GRPO's math in plain torch, named and shaped after verl's core_algos: advantage estimators
(`algorithm.adv_estimator`), policy losses (`actor.policy_loss.loss_mode`) and their
aggregation (`actor.loss_agg_mode`), each in a registry. Nothing here needs a model, Ray or a
config object.

The names below are loaded on first use (PEP 562), so that `peer_rl.algos.registry`, which the
config reads, can be imported without torch.
"""
from importlib import import_module

_HOME = {
    "advantages": ("ADV_ESTIMATORS", "compute_grpo_outcome_advantage",
                   "compute_reinforce_plus_plus_baseline_outcome_advantage",
                   "compute_rloo_outcome_advantage", "get_adv_estimator_fn", "register_adv_est",
                   "sequence_advantages"),
    "losses": ("POLICY_LOSSES", "agg_loss", "compute_policy_loss_gspo",
               "compute_policy_loss_vanilla", "entropy_from_logits", "get_policy_loss_fn",
               "kl_penalty", "logprobs_from_logits", "masked_mean", "masked_sum",
               "register_policy_loss"),
    "registry": ("LOSS_AGG_MODES",),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'peer_rl.algos' has no attribute {name!r}")
    value = getattr(import_module(f"peer_rl.algos.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
