"""Batch types that cross the controller <-> worker boundary (plain, picklable dataclasses).

Workers take and return these; the controller never sees an engine object.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from peer_rl.config import RolloutConfig


@dataclass
class Prompt:
    uid: int                      # position of the prompt in the step's batch
    messages: list[dict]          # chat messages for the policy (system + user)
    images: list[str] = field(default_factory=list)  # absolute image paths (visual rows)
    seed: int | None = None       # this request's sampling seed (request_seed); None: engine RNG


# bit widths of request_seed's fields: 15 + 22 + 2 + 16 + 8 = 63 bits, a non-negative int64
_SEED_BITS = {"run": 15, "step": 22, "stream": 2, "index": 16, "sample": 8}
STREAMS = {"rollout": 0, "rollout_final": 1, "eval": 2}


def request_seed(run_seed: int, step: int, stream: str, index: int, n: int) -> int:
    """The seed of one generation request: prompt `index` of `stream` at `step`. vLLM seeds the
    j-th of the request's n samples with seed + j, so the low 8 bits are left for j and every
    (step, stream, prompt, sample) of a run gets its own seed, whichever worker serves it."""
    b = _SEED_BITS
    for name, value, width in (("step", step, b["step"]), ("index", index, b["index"])):
        if not 0 <= value < 2 ** width:
            raise ValueError(f"request_seed: {name}={value} outside [0, 2^{width})")
    if not 1 <= n <= 2 ** b["sample"]:
        raise ValueError(f"request_seed: n={n} outside [1, 2^{b['sample']}]")
    seed = run_seed % 2 ** b["run"]
    for value, width in ((step, b["step"]), (STREAMS[stream], b["stream"]),
                         (index, b["index"])):
        seed = (seed << width) | value
    return seed << b["sample"]


def seeded(prompts: list[Prompt], run_seed: int, step: int, stream: str, n: int,
           start: int = 0) -> list[Prompt]:
    """The prompts with their request seeds, by position (from `start`) in the step's list."""
    for i, p in enumerate(prompts, start):
        p.seed = request_seed(run_seed, step, stream, i, n)
    return prompts


@dataclass
class SamplingConfig:
    """Per-call sampling settings; defaults are the schema's (peer_rl.config.RolloutConfig)."""
    n: int = RolloutConfig.n                      # rollout.n: samples per prompt (G)
    temperature: float = RolloutConfig.temperature
    top_p: float = RolloutConfig.top_p
    max_tokens: int = RolloutConfig.response_length
    seed: int = 0


@dataclass
class Sample:
    uid: int                      # prompt uid this sample answers
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]  # the sampler's log-probs of response_ids (temperature and
                                    # top-p applied): pi_behavior of trainer.async_training
    text: str
    finish_reason: str = ""
    images: list[str] = field(default_factory=list)  # images the engine saw (prompt_ids hold them)
    policy_version: int = 0       # updates in the weights that sampled it (the engine's stamp)


@dataclass
class JudgeItem:
    """One candidate to judge: the dialogue, its parsed steps, its reply and the reference."""
    history: list[dict]
    lang: str
    steps: list[str | None]       # Steps 1-3 bodies; None where the step is missing
    reply: str
    reference: str
    candidate_first: bool         # position of the candidate in round 4 (seeded coin)
    format_complete: bool
    images: list[str] = field(default_factory=list)  # the frame(s) shown in the Step 2 round


@dataclass
class JudgeResult:
    step_verdicts: list[bool | None]   # 3 entries; None: not asked or unparseable
    preference: int | None              # rewards.Preference value as parsed; None unparseable
    preference_ok: bool | None          # mapped back to the candidate
    reward: float
    parse_failures: int                 # unparseable answers among those asked
    asked: int                          # verdicts requested from the judge
    raw: list[str] = field(default_factory=list)  # judge answers (for logging.log_samples)


def shard(items: list, n: int) -> list[list]:
    """Contiguous, near-equal chunks, the first ones a row longer (numpy's array_split), so
    re-concatenating keeps prompt order."""
    import numpy as np

    return [[items[i] for i in part] for part in np.array_split(np.arange(len(items)), n)]
