"""A run's report (report.json, report.md, PNG figures) and `eval compare` across runs, in the
papers' layout: ESC-Eval dimensions on the 0-100 scale, SAGE sentient score / success rate /
bands, safety pass rates per group, diversity figures, Client-Counselor-Judge scores 0-10
(headline: the mean of the three perspectives)."""
from __future__ import annotations

import json
from pathlib import Path

from peer_rl.files.out_paths import read_json, write_atomic
from peer_rl.evaluation import figures
from peer_rl.evaluation.prompts import (CCJ_DIMENSIONS, CCJ_PERSPECTIVES, CCJ_TITLES,
                                        DIMENSIONS, DIMENSION_TITLES)
from peer_rl.evaluation.sage import BANDS
from peer_rl.evaluation.store import MANIFEST_FILE

REPORT_JSON, REPORT_MD = "report.json", "report.md"
DIVERSITY_KEYS = ("distinct_1", "distinct_2", "self_similarity", "within_prompt_similarity",
                  "history_similarity")
SAFETY_GROUPS = ("crisis", "harmful_request", "boundary")
SAFETY_GROUPS_HEADER = ["crisis", "harmful request", "boundary"]


def _f(v, digits: int = 2, pct: bool = False) -> str:
    if v is None:
        return "n/a"
    return f"{v * 100:.1f}%" if pct else f"{v:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# ---------------------------------------------------------------- one protocol, many models
def esc_table(named: dict[str, dict]) -> str:
    header = ["model"] + [DIMENSION_TITLES[d] for d in DIMENSIONS] + ["Average", "dialogues"]
    rows = [[name] + [_f(s["dimensions"][d]["scaled"]) for d in DIMENSIONS]
            + [_f(s["average_scaled"]), str(s["cases"] - s["errors"])] for name, s in named.items()]
    return _table(header, rows) + (
        "\n\nScores on the 0-100 scale (mean 0-4 score / 4 x 100) with this project's rubric "
        "wording: compare models scored by the same judge, not with the PEER paper's figures. "
        "Average: over the dialogues whose seven scores all parsed.")


def sage_table(named: dict[str, dict]) -> str:
    header = ["model", "sentient score", "success rate"] + [b for b, _ in BANDS] \
        + ["mean turns", "dialogues"]
    rows = [[name, _f(s["sentient_score"]), _f(s["success_rate"], pct=True)]
            + [str(s["bands"][b]) for b, _ in BANDS]
            + [_f(s["mean_turns"], 1), str(s["cases"] - s["errors"])] for name, s in named.items()]
    return _table(header, rows)


def safety_table(named: dict[str, dict]) -> str:
    header = ["model"] + SAFETY_GROUPS_HEADER + ["overall", "unparsed"]
    rows = []
    for name, s in named.items():
        groups = s["groups"]
        rows.append([name] + [_f(groups[g]["pass_rate"], pct=True) if g in groups else "n/a"
                              for g in SAFETY_GROUPS]
                    + [_f(s["overall"]["pass_rate"], pct=True), str(s["overall"]["unparsed"])])
    return _table(header, rows) + "\n\nPass rates over the verdicts that parsed."


def diversity_table(named: dict[str, dict]) -> str:
    header = ["model", "distinct-1", "distinct-2", "self-sim", "within-prompt sim",
              "history sim", "replies"]
    rows = [[name] + [_f(s.get(k), 3) for k in DIVERSITY_KEYS] + [str(s.get("replies", 0))]
            for name, s in named.items()]
    return _table(header, rows) + ("\n\nDistinct-n: higher is more diverse; similarities "
                                   "(cosine, clipped at 0): lower is more diverse.")


def ccj_averages(s: dict) -> tuple[float | None, float | None]:
    """(the mean of the three perspectives, the mean of the seven dimensions). A report written
    before both were kept has one `average`: the seven dimensions' mean."""
    if "dimension_average" not in s:
        return None, s.get("average")
    return s["average"], s["dimension_average"]


def ccj_table(named: dict[str, dict]) -> str:
    header = ["model"] + [CCJ_TITLES[d] for d in CCJ_DIMENSIONS] \
        + ["Average (perspectives)", "7-dimension mean", "contexts"]
    rows = [[name] + [_f(s["dimensions"][d]["mean"]) for d in CCJ_DIMENSIONS]
            + [_f(v) for v in ccj_averages(s)] + [str(s["cases"] - s["errors"])]
            for name, s in named.items()]
    groups = "; ".join(f"{p.capitalize()}: {', '.join(CCJ_TITLES[d] for d in ds)}"
                       for p, ds in CCJ_PERSPECTIVES.items())
    return _table(header, rows) + (
        f"\n\nScores 0-10. {groups}. Average (perspectives): the mean of the three perspectives' "
        "means, the paper's average; 7-dimension mean: the seven dimensions weighed alike. Both "
        "over the contexts whose seven scores all parsed. The prompts are this project's "
        "wording: compare models scored by the same judge, not with the paper's figures.")


TABLES = {"esc": esc_table, "sage": sage_table, "safety": safety_table,
          "diversity": diversity_table, "ccj": ccj_table}


def _figure(protocol: str, named: dict[str, dict], out: Path, stem: str) -> list[Path]:
    if protocol == "esc":
        return [figures.bars(out / f"{stem}_dimensions.png", "ESC-Eval (0-100)",
                             [DIMENSION_TITLES[d] for d in DIMENSIONS] + ["Average"],
                             {n: [s["dimensions"][d]["scaled"] for d in DIMENSIONS]
                              + [s["average_scaled"]] for n, s in named.items()}, 100)]
    if protocol == "sage":
        paths = [figures.bars(out / f"{stem}_bands.png", "SAGE: dialogues per band",
                              [b for b, _ in BANDS],
                              {n: [s["bands"][b] for b, _ in BANDS] for n, s in named.items()},
                              max([1] + [max(s["bands"].values()) for s in named.values()]))]
        if len(named) == 1:
            s = next(iter(named.values()))
            paths.append(figures.lines(out / f"{stem}_trajectories.png",
                                       "SAGE: emotion per turn", s["trajectories"], 0, 100,
                                       legend=len(s["trajectories"]) <= 12))
        else:
            paths.append(figures.lines(out / f"{stem}_trajectories.png",
                                       "SAGE: mean emotion per turn",
                                       {n: mean_trajectory(s["trajectories"])
                                        for n, s in named.items()}, 0, 100))
        return paths
    if protocol == "ccj":
        return [figures.bars(out / f"{stem}_dimensions.png", "Client-Counselor-Judge (0-10)",
                             [CCJ_TITLES[d] for d in CCJ_DIMENSIONS] + ["Average (perspectives)"],
                             {n: [s["dimensions"][d]["mean"] for d in CCJ_DIMENSIONS]
                              + [ccj_averages(s)[0]] for n, s in named.items()}, 10)]
    if protocol == "safety":
        return [figures.bars(out / f"{stem}_groups.png", "Safety: pass rate (%)",
                             SAFETY_GROUPS_HEADER + ["overall"],
                             {n: [_pct(s["groups"].get(g, {}).get("pass_rate"))
                                  for g in SAFETY_GROUPS] + [_pct(s["overall"]["pass_rate"])]
                              for n, s in named.items()}, 100)]
    return [figures.bars(out / f"{stem}_metrics.png", "Diversity of replies",
                         ["distinct-1", "distinct-2", "self-sim", "within-prompt sim",
                          "history sim"],
                         {n: [s.get(k) for k in DIVERSITY_KEYS] for n, s in named.items()}, 1.0)]


def _pct(v):
    return None if v is None else v * 100


def mean_trajectory(trajectories: dict[str, list[float]]) -> list[float]:
    """Per turn, the mean emotion over dialogues; a dialogue that ended keeps its last value."""
    if not trajectories:
        return []
    length = max(len(t) for t in trajectories.values())
    padded = [t + [t[-1]] * (length - len(t)) for t in trajectories.values()]
    return [sum(col) / len(col) for col in zip(*padded)]


def model_label(manifest: dict) -> str:
    m = manifest.get("parties", {}).get("model", {})
    name = m.get("path") or f"{m.get('url', '?')} {m.get('model', '')}".strip()
    rag = manifest.get("rag")
    return f"{name} ({m.get('prompt', 'peer')}" + (f" + RAG k={rag['k']})" if rag else ")")


def write_report(out_dir: str | Path, summary: dict, manifest: dict) -> dict:
    """report.json (the summary + the run's settings), report.md and the figures."""
    out = Path(out_dir)
    protocol = summary["protocol"]
    label = model_label(manifest)
    figs = _figure(protocol, {label: summary}, out, protocol)
    report = {"summary": summary, "manifest": manifest, "figures": [p.name for p in figs]}
    # whole or absent: `compare`, a ladder and a chain read them and count them as done
    write_atomic(out / REPORT_JSON, json.dumps(report, ensure_ascii=False, indent=1))
    lines = [f"# {protocol} evaluation", "", f"Model: {label}", "",
             TABLES[protocol]({label: summary}), ""]
    lines += _notes(summary)
    lines += [f"![{p.stem}]({p.name})" for p in figs]
    write_atomic(out / REPORT_MD, "\n".join(lines) + "\n")
    return report


def _notes(s: dict) -> list[str]:
    notes = [f"- cases: {s['cases']} ({s['errors']} ended by an endpoint error"
             + (f": {', '.join(map(str, s['error_ids'][:10]))}" if s["errors"] else "") + ")"]
    if s.get("skipped_inputs"):
        notes.append(f"- invalid input items skipped: {len(s['skipped_inputs'])}")
    if s.get("left_out_languages"):
        notes.append("- cases left out by `languages=`: " + ", ".join(
            f"{n} {lang}" for lang, n in sorted(s["left_out_languages"].items())))
    if s["protocol"] in ("esc", "ccj"):
        notes.append(f"- judge scores that did not parse: {s['judge_unparsed']}")
        notes += _incomplete_note(s)
    if s["protocol"] == "sage":
        notes.append(f"- emotion changes that did not parse (counted as 0): "
                     f"{s['change_unparsed']} of {s['changes_asked']}; endings: {s['ends']}")
    if s["protocol"] in _SPREAD:
        notes += _spread_note(s)
    if s["protocol"] == "safety":
        for g, r in s["groups"].items():
            notes.append(f"- {g}: {r['judged']} judged, {r['unparsed']} unparsed; failing ids: "
                         + (", ".join(map(str, r["failing_ids"])) or "none"))
    if s.get("format_rate") is not None:
        notes.append(f"- answers in the prompt's format (peer: a Step 4; escrag: <think> then "
                     f"a reply): {_f(s['format_rate'], pct=True)}")
    return notes + [""]


def _incomplete_note(s: dict) -> list[str]:
    """Which cases the averages leave out, and the dimensions they lack."""
    if "complete" not in s:            # reports written before the averages said so
        return []
    judged = s["cases"] - s["errors"]
    line = f"- averages over {s['complete']} of {judged} cases (those with every dimension parsed)"
    if s["incomplete_ids"]:
        ids = ", ".join(map(str, s["incomplete_ids"][:10]))
        more = f" and {len(s['incomplete_ids']) - 10} more" if len(s["incomplete_ids"]) > 10 else ""
        line += (f"; left out: {ids}{more}; missing: "
                 + ", ".join(f"{d} {n}" for d, n in s["missing"].items()))
    return [line]


_SPREAD = {"esc": ("judge_scores", "the judge gave", "score"),
           "ccj": ("judge_scores", "the judge gave", "score"),
           "sage": ("changes", "the seeker reported", "emotion change")}


def constant_judge(s: dict) -> str | None:
    """A warning when the judge gave one value to everything: such a judge tells no two
    dialogues apart, so no difference can be read from the table."""
    if s.get("protocol") not in _SPREAD:
        return None
    key, who, what = _SPREAD[s["protocol"]]
    counts = s.get(key) or {}       # reports written before the counts existed: no warning
    total = sum(counts.values())
    if len(counts) != 1 or total < 2:
        return None
    return (f"{who} the same {what} ({next(iter(counts))}) all {total} times: it does not "
            "tell these dialogues apart, so this table cannot rank models; use a stronger judge")


def _spread_note(s: dict) -> list[str]:
    counts = s.get(_SPREAD[s["protocol"]][0])
    if not counts:
        return []
    what = _SPREAD[s["protocol"]][2]
    notes = [f"- {what}s given (value: count): " + ", ".join(f"{v}: {n}" for v, n in counts.items())]
    warning = constant_judge(s)
    return notes + ([f"- **{warning}**"] if warning else [])


def compare_runs(run_dirs: list[str | Path], out_dir: str | Path,
                 names: list[str] | None = None) -> Path:
    """compare.md (+ .json and figures): one table per protocol found, models side by side."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_protocol: dict[str, dict[str, dict]] = {}
    for i, run in enumerate(run_dirs):
        path = Path(run) / REPORT_JSON
        if not path.exists():
            raise FileNotFoundError(f"{run}: no {REPORT_JSON} (is it the --out of a finished "
                                    "`peer-rl eval` run?)")
        report = read_json(path, "evaluation report")
        manifest = report.get("manifest") or read_json(Path(run) / MANIFEST_FILE)
        name = names[i] if names and i < len(names) else model_label(manifest)
        table = by_protocol.setdefault(report["summary"]["protocol"], {})
        if name in table:
            name = f"{name} [{Path(run).name}]"
        table[name] = report["summary"]
    lines = ["# Comparison", ""]
    for protocol, named in by_protocol.items():
        figs = _figure(protocol, named, out, f"compare_{protocol}")
        lines += [f"## {protocol}", "", TABLES[protocol](named), ""]
        warnings = [f"- {n}: {w}" for n, w in ((n, constant_judge(s)) for n, s in named.items())
                    if w]
        lines += warnings + [""] * bool(warnings)
        lines += [f"![{p.stem}]({p.name})" for p in figs] + [""]
    write_atomic(out / "compare.json", json.dumps(by_protocol, ensure_ascii=False, indent=1))
    md = write_atomic(out / "compare.md", "\n".join(lines))
    return md
