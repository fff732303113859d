"""The simulated seeker's emotion, as SAGE defines it and RLVER trains on it: one set of rules for
`eval sage` and for training on whole conversations.

The seeker starts at 40; after each supporter turn it states a change, an integer in [-10, 10]
(one outside is held to the range; an unparseable one counts as 0 and is recorded by the
caller); the emotion stays in [0, 100]. The dialogue ends at 100 (success), below 10 (failure),
when the seeker says goodbye, or at the turn limit. RLVER's reward is the final emotion scaled
to [0, 1]: final / 100.
"""
from __future__ import annotations

from dataclasses import dataclass

# how a dialogue ends: SAGE's four, and `length` when the policy's next prompt would leave no
# room for its reply in rollout.max_model_len (the dialogue is trained as far as it got)
ENDS = ("success", "failure", "goodbye", "max_turns", "length")


@dataclass(frozen=True)
class EmotionRules:
    start: int = 40            # the seeker's emotion before the first supporter turn
    low: int = 10              # below it the seeker gives up (failure)
    high: int = 100            # at it the seeker is helped (success)
    max_change: int = 10       # a turn moves the emotion by at most this much either way

    def __post_init__(self):
        if not (0 <= self.start <= 100 and 0 <= self.low < self.high <= 100
                and self.max_change >= 1):
            raise ValueError(f"emotion rules: expected start in [0, 100], 0 <= low < high <= 100 "
                             f"and max_change >= 1, got {self}")


def next_emotion(emotion: int, change: int | None, rules: EmotionRules = EmotionRules()) -> int:
    """The emotion after a turn whose stated change is `change` (None: unparseable, 0)."""
    step = max(-rules.max_change, min(rules.max_change, change or 0))
    return max(0, min(100, emotion + step))


def emotion_end(emotion: int, rules: EmotionRules = EmotionRules()) -> str | None:
    """"success" or "failure" where the emotion alone ends the dialogue, else None."""
    if emotion >= rules.high:
        return "success"
    if emotion < rules.low:
        return "failure"
    return None


def emotion_reward(final: int) -> float:
    """RLVER's dialogue reward: the final emotion on [0, 1]."""
    return final / 100.0
