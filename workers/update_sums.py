"""What one rank of the policy group adds up over an update, by name: summed over ranks with one
all_reduce and turned into the update's actor/* and timing_s/* metrics.

The fields are packed into one float64 tensor in their declared order and read back by name, so
adding a field cannot shift another's value (the positional tensor it replaces could).
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, fields

import torch
import torch.distributed as dist


@dataclass
class UpdateSums:
    """One rank's sums; `+` adds field by field (what the all_reduce does across ranks)."""

    # each micro-batch's share of its mini-batch aggregate over world_size, summed over
    # mini-batches: summed over ranks, the mini-batch aggregates summed over optimizer steps
    pg_loss: float = 0.0
    kl_loss: float = 0.0
    entropy: float = 0.0
    # the loss's per micro-batch figures times the micro-batch's tokens (token-weighted)
    pg_clipfrac: float = 0.0
    pg_clipfrac_lower: float = 0.0
    ppo_kl: float = 0.0
    tokens: float = 0.0
    # positions the training forwards computed, and those that were real tokens of weighted
    # rows (the rest is padding)
    positions: float = 0.0
    real_positions: float = 0.0
    # tokens every forward of the update ran (reference, old-log-prob and training passes; a
    # shared prefix counted once: actor.shared_prefix)
    forward_tokens: float = 0.0
    # seconds, summed over ranks (the metrics give their mean)
    old_ref_log_prob_s: float = 0.0
    update_actor_s: float = 0.0
    update_total_s: float = 0.0
    image_preprocess_s: float = 0.0

    def __add__(self, other: UpdateSums) -> UpdateSums:
        return UpdateSums(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def pack(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The fields as one float64 tensor, in declared order."""
        return torch.tensor(astuple(self), dtype=torch.float64, device=device)

    @classmethod
    def unpack(cls, packed: torch.Tensor) -> UpdateSums:
        """Inverse of `pack`: each value back under its field's name."""
        values = packed.cpu().tolist()
        return cls(**{f.name: values[i] for i, f in enumerate(fields(cls))})

    def all_reduce(self, device: torch.device) -> UpdateSums:
        """The sums of every rank (collective: one all_reduce on `device`)."""
        packed = self.pack(device)
        dist.all_reduce(packed)
        return UpdateSums.unpack(packed)

    def metrics(self, steps: int, world_size: int) -> dict:
        """The update's metrics from the sums of all ranks: the losses per optimizer step
        (`steps` of them), the clip fractions and ppo_kl per token, the timings per rank."""
        steps, tokens = max(steps, 1), max(self.tokens, 1.0)
        return {"actor/pg_loss": self.pg_loss / steps, "actor/kl_loss": self.kl_loss / steps,
                "actor/entropy": self.entropy / steps,
                "actor/pg_clipfrac": self.pg_clipfrac / tokens,
                "actor/pg_clipfrac_lower": self.pg_clipfrac_lower / tokens,
                "actor/ppo_kl": self.ppo_kl / tokens, "actor/tokens": self.tokens,
                "actor/padding_share": 1.0 - self.real_positions / max(self.positions, 1.0),
                "actor/forward_tokens": self.forward_tokens,
                "timing_s/old_ref_log_prob": self.old_ref_log_prob_s / world_size,
                "timing_s/update_actor": self.update_actor_s / world_size,
                "timing_s/update_total": self.update_total_s / world_size,
                "timing_s/image_preprocess": self.image_preprocess_s / world_size}
