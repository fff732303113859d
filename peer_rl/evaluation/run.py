"""`peer-rl eval <protocol>`: load the cases, open the parties, run what is not yet on file,
write the report. Rerunning the same command on the same --out continues the run."""
from __future__ import annotations

import hashlib
import logging
from collections import Counter
from functools import partial
from pathlib import Path

from peer_rl.config.schema import public_config
from peer_rl.errors import ConfigError
from peer_rl.evaluation import cases as case_files
from peer_rl.evaluation.ccj import ccj_case, summarise_ccj
from peer_rl.evaluation.config import ROLES, SAMPLE_EVAL
from peer_rl.evaluation.diversity import diversity_case, judge_rewards, summarise_diversity
from peer_rl.evaluation.endpoints import close_all, open_endpoints
from peer_rl.evaluation.esc import esc_case, summarise_esc
from peer_rl.evaluation.report import write_report
from peer_rl.evaluation.retriever import LocalRetriever
from peer_rl.evaluation.runner import run_cases
from peer_rl.evaluation.safety import safety_case, summarise_safety
from peer_rl.evaluation.sage import sage_case, summarise_sage
from peer_rl.evaluation.store import MANIFEST_FILE, RunStore
from peer_rl.evaluation.supporter import Supporter
from peer_rl.files.out_paths import claim_dir, mark_dir
from peer_rl.prompts.policy import PolicyTemplate
from peer_rl.retrieval.index import INDEX_FILE, INFO_FILE, META_FILE

log = logging.getLogger(__name__)

# what identifies a party's answers (operational knobs such as concurrency may change on rerun)
_PARTY_KEYS = ("url", "path", "model", "prompt", "template", "temperature", "top_p",
               "max_tokens", "structured", "images")


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _inputs(protocol: str, cfg) -> tuple[case_files.Loaded, dict]:
    """The cases and what identifies them (file + hash) for the run's manifest."""
    from peer_rl.data.bundled import sample_root  # deferred: pulls in PIL

    skip = cfg.skip_invalid
    if protocol == "esc":
        path = Path(cfg.esc.cards or SAMPLE_EVAL / "esc_cards.json")
        return case_files.load_role_cards(path, skip), {"file": str(path), "sha256": _sha256(path)}
    if protocol == "sage":
        path = Path(cfg.sage.profiles or SAMPLE_EVAL / "sage_profiles.jsonl")
        return case_files.load_profiles(path, skip), {"file": str(path), "sha256": _sha256(path)}
    if protocol == "ccj" and cfg.ccj.esconv:
        path = Path(cfg.ccj.esconv)
        return (case_files.load_esconv_contexts(path, cfg.ccj.esconv_per_dialogue, cfg.seed),
                {"file": str(path), "sha256": _sha256(path)})
    root = Path(cfg[protocol].root or sample_root())
    if protocol == "ccj":
        files = sorted((root / cfg.ccj.subset).glob(cfg.ccj.pattern + ".jsonl"))
        loaded = case_files.load_contexts(root, cfg.ccj.subset, cfg.ccj.pattern, skip)
    elif protocol == "safety":
        files = sorted((root / "safety").glob("*.jsonl"))
        loaded = case_files.load_probes(root, skip)
    else:
        files = sorted((root / "grpo").glob(cfg.diversity.pattern + ".jsonl"))
        loaded = case_files.load_diversity_prompts(root, cfg.diversity.pattern, skip)
    return loaded, {"files": {str(f): _sha256(f) for f in files}}


def _rag(cfg) -> dict | None:
    """What identifies the retrieval of a RAG run: index files' hashes, k, embedding model."""
    if not cfg.rag.index:
        return None

    d = Path(cfg.rag.index)
    for name in (INDEX_FILE, META_FILE, INFO_FILE):
        if not (d / name).is_file():
            raise FileNotFoundError(f"rag.index={cfg.rag.index!r}: no {name} there (build one "
                                    f"with `peer-rl index build DATA --out {d}`)")
    return {"index": str(d), "k": cfg.rag.k, "embedding_model": cfg.rag.embedding_model,
            "sha256": {n: _sha256(d / n) for n in (INDEX_FILE, META_FILE)}}


def manifest_of(protocol: str, cfg, inputs: dict) -> dict:
    """The run's run.json; its settings and parties as public_config gives them (no key or
    secret: a value read from the environment stays `${oc.env:...}`)."""
    public = public_config(cfg)
    manifest = {"protocol": protocol, "settings": public.get(protocol, {}), "inputs": inputs,
                "parties": {r: {k: public[r][k] for k in _PARTY_KEYS} for r in ROLES[protocol]}}
    rag = _rag(cfg)
    if rag:
        manifest["rag"] = rag
    return manifest


def supporter_of(cfg):
    """The model party's style, with the policy template for the peer prompt."""
    if cfg.model.prompt != "peer":
        return Supporter(cfg.model.prompt)
    return Supporter("peer", PolicyTemplate.load(cfg.model.template or cfg.model.path))


def _program(protocol: str, cfg):
    style, rag_k = supporter_of(cfg), cfg.rag.k if cfg.rag.index else 0
    if protocol == "esc":
        return partial(esc_case, style=style, rounds=cfg.esc.rounds, rag_k=rag_k)
    if protocol == "sage":
        return partial(sage_case, style=style, start=cfg.sage.start_emotion,
                       max_turns=cfg.sage.max_turns, rag_k=rag_k)
    if protocol == "safety":
        return partial(safety_case, style=style, rag_k=rag_k)
    if protocol == "ccj":
        return partial(ccj_case, style=style, rag_k=rag_k)
    return partial(diversity_case, style=style, n=cfg.diversity.n, images=cfg.model.images,
                   rag_k=rag_k)


def summarise(protocol: str, records: list[dict], cfg) -> dict:
    if protocol == "esc":
        return summarise_esc(records)
    if protocol == "sage":
        return summarise_sage(records)
    if protocol == "safety":
        return summarise_safety(records)
    if protocol == "ccj":
        return summarise_ccj(records)
    # deferred: tests patch load_embedding_model
    from peer_rl.models.encoders import load_embedding_model

    encoder = load_embedding_model(cfg.diversity.embedding_model)
    summary = summarise_diversity(records, encoder.encode)
    if cfg.diversity.reward_model:
        summary["judge_reward"] = judge_rewards(records, cfg.diversity.reward_model,
                                                cfg.diversity.reward_max_tokens, cfg.seed)
    return summary


def open_parties(protocol: str, cfg) -> dict:
    """The protocol's endpoints, plus the in-process retriever under RAG inference."""
    endpoints = open_endpoints({r: cfg[r] for r in ROLES[protocol]}, seed=cfg.seed)
    if cfg.rag.index:
        try:
            endpoints["retrieval"] = LocalRetriever(cfg.rag.index, cfg.rag.embedding_model)
        except BaseException:
            close_all(endpoints)
            raise
    return endpoints


def _keep_languages(loaded, languages) -> dict[str, int]:
    """Drop the cases outside `languages` (cases without a language are kept); return the
    count per language left out."""
    from peer_rl.data.loading import LANGUAGE_NAMES  # deferred: pulls in datasets

    wanted = {LANGUAGE_NAMES.get(x, x) for x in languages}
    if not wanted:
        return {}
    lang = [LANGUAGE_NAMES.get(getattr(c, "language", ""), getattr(c, "language", ""))
            for c in loaded.items]
    out = Counter(x for x in lang if x and x not in wanted)
    loaded.items = [c for c, x in zip(loaded.items, lang) if not x or x in wanted]
    return dict(out)


def _nothing_to_run(protocol: str, inputs: dict, languages, left_out: dict[str, int]) -> str:
    """Why an evaluation has no case: an empty report would read as a finished run."""
    where = inputs.get("file") or ", ".join(inputs.get("files") or {}) or "(no input file)"
    if left_out:
        dropped = ", ".join(f"{n} {lang}" for lang, n in sorted(left_out.items()))
        return (f"eval {protocol}: languages={list(languages)} keeps none of the cases in "
                f"{where} (left out: {dropped}); evaluate a model that reads them with "
                "languages= naming theirs, or give inputs in a language it reads")
    return f"eval {protocol}: no cases in {where}"


def _input_paths(cfg, inputs: dict) -> list[str]:
    """What an evaluation reads from disk: its case files and any local model or index."""
    found = [inputs.get("file")] + list(inputs.get("files") or {})
    found += [cfg[r].get("path") for r in ("model", "seeker", "judge") if r in cfg]
    found.append(cfg.get("rag", {}).get("index") if "rag" in cfg else None)
    return [p for p in found if p]


def evaluate(protocol: str, cfg, out_dir: str | Path) -> dict:
    """Run (or continue) one evaluation; returns its report."""
    loaded, inputs = _inputs(protocol, cfg)
    left_out = _keep_languages(loaded, cfg.languages)
    if not loaded.items:    # before the directory is claimed: nothing is written
        raise ConfigError(_nothing_to_run(protocol, inputs, cfg.languages, left_out))
    # the store makes the directory (private to the user) and marks it once it holds the lock
    claim_dir(out_dir, f"eval {protocol}", _input_paths(cfg, inputs), resume=True,
              create=False, run_state=MANIFEST_FILE)
    todo = loaded.items[:cfg.limit] if cfg.limit else loaded.items
    manifest = manifest_of(protocol, cfg, inputs)
    store = RunStore(out_dir, manifest)
    mark_dir(out_dir, f"eval {protocol}")
    try:
        if store.torn_lines:
            log.info(f"{store.path}: dropped {store.torn_lines} line(s) cut off by an "
                     "interrupted write; those cases run again")
        missing = [c for c in todo if not store.done(c.id)]
        if missing:
            endpoints = open_parties(protocol, cfg)
            try:
                run_cases(todo, _program(protocol, cfg), endpoints, store, cfg.batch_cases,
                          desc=f"eval {protocol}")
            finally:
                close_all(endpoints)
    finally:
        store.close()
    records = [store.records[c.id] for c in todo]
    summary = summarise(protocol, records, cfg)
    summary["skipped_inputs"] = loaded.skipped
    if cfg.languages:
        summary["left_out_languages"] = left_out
    summary["resumed_cases"] = len(todo) - len(missing)
    return write_report(out_dir, summary, manifest)
