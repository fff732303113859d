"""GRPO's math in plain torch, named and shaped after verl's core_algos: advantage estimators
(`algorithm.adv_estimator`), policy losses (`actor.policy_loss.loss_mode`) and their
aggregation (`actor.loss_agg_mode`), each in a registry. Nothing here needs a model, Ray or a
config object."""
from peer_rl.algos.advantages import (ADV_ESTIMATORS, compute_grpo_outcome_advantage,
                                      compute_reinforce_plus_plus_baseline_outcome_advantage,
                                      compute_rloo_outcome_advantage, get_adv_estimator_fn,
                                      register_adv_est, sequence_advantages)
from peer_rl.algos.losses import (LOSS_AGG_MODES, POLICY_LOSSES, agg_loss,
                                  compute_policy_loss_gspo, compute_policy_loss_vanilla,
                                  entropy_from_logits, get_policy_loss_fn, kl_penalty,
                                  logprobs_from_logits, masked_mean, masked_sum,
                                  register_policy_loss)

__all__ = ["ADV_ESTIMATORS", "LOSS_AGG_MODES", "POLICY_LOSSES", "agg_loss",
           "compute_grpo_outcome_advantage", "compute_policy_loss_gspo",
           "compute_policy_loss_vanilla", "compute_reinforce_plus_plus_baseline_outcome_advantage",
           "compute_rloo_outcome_advantage", "entropy_from_logits", "get_adv_estimator_fn",
           "get_policy_loss_fn", "kl_penalty", "logprobs_from_logits", "masked_mean", "masked_sum",
           "register_adv_est", "register_policy_loss", "sequence_advantages"]
