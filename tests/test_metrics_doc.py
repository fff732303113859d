"""docs/metrics.md against the metric keys the code writes to metrics.jsonl, read off the source.

The keys are collected statically (no Ray): every `"a/b"`-shaped string used as a dict key or an
assigned subscript in peer_rl/ and workers/, and every f-string of that shape. The f-string
families are expanded from the code that fills them (the stages `timing[...]` is set for,
`summarise`'s call sites, `diversity_metrics`'s own keys); one whose values come from the data
(`eval/safety/<group>_pass_rate`) stays a template and the page documents it as one. A key the
code gains without a line on the page fails here, and so does a documented key no code writes.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import numpy as np

from peer_rl.tracking.metrics import RENAMED

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "metrics.md"
KEY = re.compile(r"^[a-z_0-9<>]+(/[a-z_0-9<>]+)+$")
# files whose "a/b" keys are not metrics.jsonl's
NOT_METRICS = {
    "workers/fsdp.py": "state-dict names inside a checkpoint",
    "peer_rl/integrations/verl_reward.py": "verl's reward_extra_info, listed on verl.md",
    "peer_rl/algos/losses.py": "the loss's own figures per micro-batch, which "
                               "workers/update_sums.py aggregates into actor/pg_clipfrac, "
                               "actor/ppo_kl and actor/pg_clipfrac_lower",
}


def _template(node: ast.JoinedStr) -> str:
    """f"timing_s/{k}" -> "timing_s/<k>"."""
    out = ""
    for part in node.values:
        if isinstance(part, ast.Constant):
            out += str(part.value)
        else:
            out += f"<{ast.unparse(part.value)}>"
    return out


def _sources():
    for base in ("peer_rl", "workers"):
        for path in sorted((ROOT / base).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in NOT_METRICS:
                yield rel, ast.parse(path.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=None)
def collect() -> tuple[set[str], set[str], set[str], set[str]]:
    """(literal keys, f-string templates, timing stages, summarise prefixes) in the source."""
    literal, templates, stages, summarised = set(), set(), set(), set()
    for _, tree in _sources():
        for node in ast.walk(tree):
            keys = []
            if isinstance(node, ast.Dict):
                keys = [k for k in node.keys if k is not None]
            elif isinstance(node, ast.DictComp):
                keys = [node.key]
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Subscript):
                        keys.append(t.slice)
                        if isinstance(t.value, ast.Name) and t.value.id == "timing" and \
                                isinstance(t.slice, ast.Constant):
                            stages.add(t.slice.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id == "summarise" and node.args and \
                    isinstance(node.args[0], ast.Constant):
                summarised.add(node.args[0].value)
            for k in keys:
                if isinstance(k, ast.Constant) and isinstance(k.value, str) and KEY.match(k.value):
                    literal.add(k.value)
                elif isinstance(k, ast.JoinedStr) and KEY.match(_template(k)):
                    templates.add(_template(k))
    return literal, templates, stages, summarised


def _diversity_keys() -> set[str]:
    """The float-valued keys diversity_metrics returns, from a two-prompt call (orthonormal
    embeddings stand in for the encoder: only the keys are read)."""
    from peer_rl.evaluation.diversity import diversity_metrics

    def encode(texts):
        return np.eye(len(texts), 16)[: len(texts)]

    div = diversity_metrics([["a b c", "d e f"], ["g h i", "j k l"]],
                            [["hello there"], ["how are you"]], encode)
    return {k for k, v in div.items() if isinstance(v, float)}


def emitted_keys() -> set[str]:
    """Every key (or data-dependent template) the code writes, the families expanded."""
    from peer_rl.trainer.dynamic_sampling import zero_variance_metrics

    literal, templates, stages, summarised = collect()
    expand = {
        "timing_s/<k>": {f"timing_s/{s}" for s in stages},
        "<prefix>/mean": {f"{p}/mean" for p in summarised},
        "<prefix>/max": {f"{p}/max" for p in summarised},
        "<prefix>/min": {f"{p}/min" for p in summarised},
        "eval/diversity/<k>": {f"eval/diversity/{k}" for k in _diversity_keys()},
        "groups/zero_variance_share/<metric>": set(zero_variance_metrics([])),
    }
    keys = set(literal) - set(RENAMED)       # old names, only ever read back
    for t in templates:
        keys |= expand.get(t, {t})
    return keys


def documented_keys() -> set[str]:
    """The keys in the first column of the page's tables (several may share a row)."""
    out = set()
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            out |= {k for k in re.findall(r"`([^`]+)`", first) if KEY.match(k)}
    return out


def _norm(key: str) -> str:
    return re.sub(r"<[^>]*>", "<>", key)


def test_collector_finds_the_families_it_expands():
    """The collector itself: each family it expands has members, and known keys of each kind
    (a dict literal, an assigned subscript, an f-string family, a summarise call) are found,
    so an empty or broken scan cannot pass the comparison below."""
    literal, templates, stages, summarised = collect()
    assert {"rollout", "judge", "redundancy", "update", "sync"} <= stages
    assert {"rur/s_hist", "rur/tau", "advantages"} <= summarised
    keys = emitted_keys()
    for key in ("reward/mean", "timing_s/step", "actor/kl_loss", "timing_s/rollout",
                "advantages/min", "eval/diversity/distinct_2", "groups/zero_variance_share/reweighted",
                "eval/safety/<g>_pass_rate", "retrieval/top_score_mean", "async/staleness_max"):
        assert key in keys, key
    assert not {k for k in keys if "<prefix>" in k or k.startswith("timing_s/<")}
    assert len(keys) > 60


def test_old_names_map_to_written_ones_and_are_documented_under_them_only():
    """RENAMED (what reads metrics.jsonl back) sends each old name to a key the code writes
    today, and the page describes the new name, not the old."""
    keys, documented = emitted_keys(), documented_keys()
    for old, new in RENAMED.items():
        assert any(k == new or (new.endswith("/") and k.startswith(new)) for k in keys), new
        assert not any(k == old or (old.endswith("/") and k.startswith(old))
                       for k in documented), old


def test_every_emitted_key_is_documented():
    documented = {_norm(k) for k in documented_keys()}
    missing = sorted(k for k in emitted_keys() if _norm(k) not in documented)
    assert not missing, (f"{PAGE.name}: metric keys the code writes but the page does not "
                         f"describe: {missing}")


def test_every_documented_key_is_emitted():
    emitted = {_norm(k) for k in emitted_keys()}
    unknown = sorted(k for k in documented_keys() if _norm(k) not in emitted)
    assert not unknown, f"{PAGE.name}: documented keys no code writes: {unknown}"
