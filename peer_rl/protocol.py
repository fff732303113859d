"""What crosses the controller <-> worker boundary: one request and one response type per pool
(plain, picklable dataclasses), and how each pool call is split over the workers and gathered
(`dispatch`, declared on the worker method, as verl's dispatch modes are).

| pool | method | request | response | dispatch |
| --- | --- | --- | --- | --- |
| rollout | generate | list[Prompt], SamplingConfig | list[Sample] | SHARD |
| reward_model (UnifiReward, PRM + ORM) | score | list[JudgeItem] | list[JudgeResult] | SHARD |
| reward_model (scalar) | score | list[ScalarItem] | list[float] | SHARD |
| redundancy | similarities | replies, histories, G | Similarities | ONE |
| retrieval | search | list[RetrievalQuery], k | RetrievalHits | SHARD |

| actor (policy) | update | UpdateBatch | metrics (dict of floats) | ALL |
| actor (policy) | compute_log_prob | UpdateBatch | LogProbs | ALL |

Workers take and return these; the controller never
sees an engine object. This module imports nothing of the project: the config schema takes its
sampling defaults from here, not the other way round.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Prompt:
    uid: int                      # position of the prompt in the step's batch
    messages: list[dict]          # chat messages for the policy (system + user)
    images: list[str] = field(default_factory=list)  # absolute image paths (visual rows)
    seed: int | None = None       # this request's sampling seed (request_seed); None: engine RNG


# bit widths of request_seed's fields: 15 + 22 + 2 + 16 + 8 = 63 bits, a non-negative int64
_SEED_BITS = {"run": 15, "step": 22, "stream": 2, "index": 16, "sample": 8}
STREAMS = {"rollout": 0, "rollout_refined": 1, "eval": 2, "seeker": 3}


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
class SeekerRequest:
    """One thing the simulated seeker is asked (peer_rl.workers.seeker): its chat, the JSON
    schema its answer must follow (the analyser's; None for a reply), this request's seed."""
    messages: list[dict]
    schema: dict | None = None
    seed: int | None = None       # request_seed(..., "seeker", ...); None: the engine's RNG


@dataclass
class SamplingConfig:
    """Per-call sampling settings; the schema's rollout.* defaults are these
    (peer_rl.config.schema.RolloutConfig)."""
    n: int = 4                    # rollout.n: samples per prompt (G)
    temperature: float = 1.0      # rollout.temperature
    top_p: float = 1.0            # rollout.top_p
    max_tokens: int = 128         # rollout.response_length
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
    reference: str | None         # None: no reference reply (a simulated dialogue's turn), no round 4
    candidate_first: bool         # position of the candidate in round 4 (seeded coin)
    format_complete: bool
    images: list[str] = field(default_factory=list)  # the frame(s) shown in the Step 2 round


@dataclass
class JudgeResult:
    step_verdicts: list[bool | None]   # 3 entries; None: not asked or unparseable
    preference: int | None              # verdicts.Preference value as parsed; None unparseable
    preference_ok: bool | None          # mapped back to the candidate
    reward: float
    parse_failures: int                 # unparseable answers among those asked
    asked: int                          # verdicts requested from the judge
    raw: list[str] = field(default_factory=list)  # judge answers (for logging.log_samples)


@dataclass
class Similarities:
    """RUR's inputs per reply, in the step's reply order: the largest cosine to its prompt's
    history utterances, the mean cosine to its group's other replies (both clipped to [0, 1]),
    the length coefficient tau and the length in English-word equivalents."""
    s_hist: np.ndarray
    s_group: np.ndarray
    tau: np.ndarray
    n_words: np.ndarray

    def take(self, idx) -> "Similarities":
        return Similarities(*(np.asarray(getattr(self, f))[idx] for f in _SIMILARITY_FIELDS))

    @classmethod
    def concat(cls, parts: list["Similarities"]) -> "Similarities":
        return cls(*(np.concatenate([np.asarray(getattr(p, f)) for p in parts])
                     for f in _SIMILARITY_FIELDS))


_SIMILARITY_FIELDS = ("s_hist", "s_group", "tau", "n_words")


@dataclass
class UpdateBatch:
    """The policy's request (update, compute_log_prob): N right-padded prompt + response rows,
    put into Ray's object store once and read by every rank, each taking its own shard."""
    input_ids: np.ndarray                        # (N, T) int64
    attention_mask: np.ndarray                   # (N, T) int64: 1 on prompt and response
    response_mask: np.ndarray                    # (N, T) int64: 1 where the loss applies
    advantages: np.ndarray                       # (N,) float32
    temperature: float = 1.0                     # rollout.temperature: logits / it (as verl)
    old_log_probs: np.ndarray | None = None      # (N, T) given: the no-grad passes are skipped
    ref_log_prob: np.ndarray | None = None       # (N, T), with old_log_probs
    behavior_log_probs: np.ndarray | None = None  # (N, T) the sampler's (async training)
    policy_versions: np.ndarray | None = None    # (N,) the policy version that drew each row
    max_staleness: int = 0                       # trainer.async_training.staleness
    images: list[list[str]] | None = None        # per row: the frames the engine saw
    group_ids: np.ndarray | None = None          # (N,) verl's uid: the rows of one prompt's group

    def __post_init__(self):
        n, t = np.shape(self.input_ids)
        for name in ("attention_mask", "response_mask", "old_log_probs", "ref_log_prob",
                     "behavior_log_probs"):
            value = getattr(self, name)
            if value is not None and np.shape(value) != (n, t):
                raise ValueError(f"UpdateBatch.{name}: shape {np.shape(value)}, expected "
                                 f"{(n, t)} (input_ids')")
        for name in ("advantages", "policy_versions", "images", "group_ids"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"UpdateBatch.{name}: {len(value)} rows, expected {n}")


@dataclass
class LogProbs:
    """The policy's log-probs of an UpdateBatch, token-aligned (N, T) float32."""
    old_log_probs: np.ndarray                    # the current policy's
    ref_log_prob: np.ndarray                     # the frozen reference's


@dataclass
class ScalarItem:
    """One reply for the scalar reward model (ESCRAG-R1): the dialogue it answers."""
    history: list[dict]
    reply: str
    lang: str


@dataclass
class RetrievalQuery:
    """The history the policy was shown and its initial reply (the seeker's last turn and the
    reply are embedded); exemplars of the query's own dialogue are never returned: the same
    `dialogue` id, or a history that continues `dialogue_history` (the whole dialogue before
    any cut; None: `history` is the whole dialogue) or that it continues."""
    history: list[dict]
    reply: str
    dialogue: str | None = None
    dialogue_history: list[dict] | None = None


@dataclass
class RetrievalHits:
    """k exemplars per query ({"score", "id", "response", ...}), the own-dialogue exemplars
    passed over per query, the search's wall time, and the answering processes (a restart
    shows as a new pid)."""
    hits: list[list[dict]]
    excluded: list[int]
    seconds: float
    pids: list[int]

    @classmethod
    def concat(cls, parts: list["RetrievalHits"]) -> "RetrievalHits":
        return cls([h for p in parts for h in p.hits], [x for p in parts for x in p.excluded],
                   sum(p.seconds for p in parts), [i for p in parts for i in p.pids])


class Dispatch(enum.Enum):
    """How a pool call is split over the workers and its answers gathered."""
    SHARD = "shard"   # the first argument's items in near-equal contiguous parts, one per
                      # worker; the answers concatenated in order (`concat` of a batch type)
    ONE = "one"       # the whole call on the first worker: what must see a step's items
                      # together (RUR compares each reply with its group)
    ALL = "all"       # the same call on every worker together (SPMD, verl's ONE_TO_ALL):
                      # the policy's ranks, each taking its own shard of one batch object


def dispatch(mode: Dispatch):
    """Declares a worker method's dispatch mode (read by peer_rl.trainer.worker_group)."""
    def mark(method):
        method.dispatch = mode
        return method
    return mark


def dispatch_of(cls: type, method: str) -> Dispatch:
    mode = getattr(getattr(cls, method, None), "dispatch", None)
    if not isinstance(mode, Dispatch):
        raise TypeError(f"{cls.__name__}.{method} declares no dispatch mode "
                        "(peer_rl.protocol.dispatch)")
    return mode


def gather(parts: list):
    """The workers' answers to a SHARD call as one answer, in item order."""
    if parts and hasattr(type(parts[0]), "concat"):
        return type(parts[0]).concat(parts)
    return [x for part in parts for x in part]


def shard(items: list, n: int) -> list[list]:
    """Contiguous, near-equal chunks, the first ones a row longer (numpy's array_split), so
    re-concatenating keeps prompt order."""
    return [[items[i] for i in part] for part in np.array_split(np.arange(len(items)), n)]
