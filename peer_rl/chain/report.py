"""The comparison report of a chain (peer_rl.chain.run), read from its output layout:

    <out>/eval_rm/{judge,untuned}.json        `peer-rl eval rm` reports (with the majority baseline)
    <out>/grpo/<method>_s<seed>/metrics.jsonl  GRPO curves
    <out>/eval/<policy>/<protocol>/report.json held-out evaluations (sft, <method>_s<seed>_step<N>)

Numbers are given as mean +- standard deviation over the seeds found (n shown), never pooled
across methods; what is missing is listed, not guessed.
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from peer_rl.files.out_paths import read_json, save_figure, write_atomic
from peer_rl.evaluation.report import constant_judge
from peer_rl.tracking.metrics import read_metrics
from peer_rl.tracking.plot import pyplot

RUN = re.compile(r"^(?P<method>.+)_s(?P<seed>\d+)(?:_step(?P<step>\d+))?$")
CURVE_KEYS = ("reward/mean", "reward/format_rate", "rur/s_group/mean", "rur/s_hist/mean")
JUDGE_COLUMNS = (("step1", lambda m: m["step_accuracy"]["step1"]),
                 ("step2", lambda m: m["step_accuracy"]["step2"]),
                 ("step3", lambda m: m["step_accuracy"]["step3"]),
                 ("recall", lambda m: m["error_recall_mean"]),
                 ("balanced", lambda m: m.get("balanced_accuracy_mean")),  # older reports: -
                 ("pref", lambda m: m["preference_accuracy"]),
                 ("consist", lambda m: m["consistency"]),
                 ("parse_fail", lambda m: m["parse_failure_rate"]))
HELD_OUT = (  # (column, protocol, path into the summary)
    ("format", "diversity", ("format_rate",)),
    ("reward", "diversity", ("judge_reward", "mean")),
    ("distinct1", "diversity", ("distinct_1",)),
    ("distinct2", "diversity", ("distinct_2",)),
    ("self_sim", "diversity", ("self_similarity",)),
    ("within_sim", "diversity", ("within_prompt_similarity",)),
    ("hist_sim", "diversity", ("history_similarity",)),
    ("esc_avg", "esc", ("average",)),
    ("sage", "sage", ("sentient_score",)),
    ("safety", "safety", ("overall", "pass_rate")),
)


def _get(d, path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d if isinstance(d, (int, float)) else None


def _fmt(values: list[float]) -> str:
    """Mean +- sample sd of the values present; a cell that some runs lack says how many it
    holds, so a partial column does not pass for the row's full count of runs."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    cell = (f"{vals[0]:.3f}" if len(vals) == 1
            else f"{np.mean(vals):.3f} +- {np.std(vals, ddof=1):.3f}")
    return cell if len(vals) == len(values) else f"{cell} ({len(vals)} of {len(values)})"


def _group(names: list[str]) -> dict[str, list[str]]:
    """'peer_s0', 'peer_s1', 'sft' -> {'sft': ['sft'], 'peer': ['peer_s0', 'peer_s1']}."""
    out: dict[str, list[str]] = defaultdict(list)
    for n in sorted(names):
        m = RUN.match(n)
        key = n if not m else m.group("method") + (f" @ step {m.group('step')}"
                                                   if m.group("step") else "")
        out[key].append(n)
    return dict(out)


def judge_table(out: Path) -> list[str]:
    rows = []
    for label, name in (("fine-tuned judge", "judge"), ("untuned SmolLM2", "untuned")):
        path = out / "eval_rm" / f"{name}.json"
        if not path.exists():
            continue
        rep = read_json(path, "`eval rm` report")
        if rep["metrics"].get("all"):
            rows.append((label, rep["metrics"]["all"]))
        if name == "judge" and rep.get("majority_baseline", {}).get("metrics", {}).get("all"):
            rows.append(("majority label", rep["majority_baseline"]["metrics"]["all"]))
    if not rows:
        return ["No `eval rm` reports yet."]
    head = "| judge | n | " + " | ".join(c for c, _ in JUDGE_COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(JUDGE_COLUMNS) + 2)]
    for label, m in rows:
        cells = []
        for _, get in JUDGE_COLUMNS:
            v = get(m)
            cells.append("-" if v is None else f"{v:.3f}")
        lines.append(f"| {label} | {m['n']} | " + " | ".join(cells) + " |")
    return lines


def read_curves(out: Path) -> dict[str, list[dict]]:
    """Each GRPO run's metrics.jsonl records under today's names (older runs' mapped)."""
    runs = {}
    for path in sorted((out / "grpo").glob("*/metrics.jsonl")):
        runs[path.parent.name] = read_metrics(path)     # a torn last line left out
    return runs


def training_table(runs: dict[str, list[dict]]) -> list[str]:
    if not runs:
        return ["No GRPO runs yet."]
    lines = ["| method | runs | steps | reward first 5 | reward last 5 | format last 5 "
             "| s_group last 5 |", "|---|---|---|---|---|---|---|"]
    for method, names in _group(list(runs)).items():
        def window(key, last):
            vals = []
            for n in names:
                xs = [r[key] for r in runs[n] if isinstance(r.get(key), (int, float))]
                if xs:
                    vals.append(float(np.mean(xs[-5:] if last else xs[:5])))
            return vals
        steps = [max((r["step"] for r in runs[n]), default=0) for n in names]
        lines.append(f"| {method} | {len(names)} | {', '.join(map(str, steps))} | "
                     f"{_fmt(window('reward/mean', False))} | {_fmt(window('reward/mean', True))} "
                     f"| {_fmt(window('reward/format_rate', True))} "
                     f"| {_fmt(window('rur/s_group/mean', True))} |")
    return lines


def plot_runs(runs: dict[str, list[dict]], path: Path) -> Path | None:
    if not runs:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(CURVE_KEYS), figsize=(4 * len(CURVE_KEYS), 3.4))
    for ax, key in zip(axes, CURVE_KEYS):
        for name, recs in sorted(runs.items()):
            pts = [(r["step"], r[key]) for r in recs if isinstance(r.get(key), (int, float))]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=2, label=name)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def held_out_table(out: Path) -> list[str]:
    reports: dict[str, dict[str, dict]] = defaultdict(dict)
    for path in sorted((out / "eval").glob("*/*/report.json")):
        reports[path.parent.parent.name][path.parent.name] = read_json(
            path, "evaluation report")["summary"]
    if not reports:
        return ["No held-out evaluations yet."]
    lines = ["| policy | runs | " + " | ".join(c for c, _, _ in HELD_OUT) + " |",
             "|" + "---|" * (len(HELD_OUT) + 2)]
    order = sorted(_group(list(reports)).items(), key=lambda kv: (kv[0] != "sft", kv[0]))
    for method, names in order:
        cells = [_fmt([_get(reports[n].get(proto, {}), key) for n in names])
                 for _, proto, key in HELD_OUT]
        lines.append(f"| {method} | {len(names)} | " + " | ".join(cells) + " |")
    flat = defaultdict(list)
    for name, protocols in sorted(reports.items()):
        for protocol, summary in protocols.items():
            if constant_judge(summary):
                flat[protocol].append(name)
    return lines + [f"\n{protocol}: the judge gave one value to every dialogue of "
                    f"{', '.join(names)} (see their report.md): that column ranks nothing."
                    for protocol, names in flat.items()]


def safety_table(out: Path) -> list[str]:
    """Pass rate per probe group (crisis, ...), mean +- sd over seeds."""
    found: dict[str, dict] = {}
    for path in sorted((out / "eval").glob("*/safety/report.json")):
        found[path.parent.parent.name] = read_json(path, "evaluation report")["summary"]
    if not found:
        return []
    groups = sorted({g for s in found.values() for g in s.get("groups", {})})
    lines = ["| policy | " + " | ".join(groups) + " |", "|" + "---|" * (len(groups) + 1)]
    order = sorted(_group(list(found)).items(), key=lambda kv: (kv[0] != "sft", kv[0]))
    for method, names in order:
        cells = [_fmt([_get(found[n], ("groups", g, "pass_rate")) for n in names])
                 for g in groups]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return ["Safety pass rate per probe group:", "", *lines, ""]


def write_chain_report(values: dict) -> Path:
    out = Path(values["out"])
    runs = read_curves(out)
    png = plot_runs(runs, out / "curves.png")
    found = sorted({int(m.group("seed")) for m in map(RUN.match, runs) if m})
    lines = ["# Chain report", "",
             f"Output: `{out}`; the chain's seeds {values.get('seeds')}, GRPO runs found for "
             f"seeds {found or 'none'}. Cells are mean +- sample standard deviation over the "
             "runs found (one value when one run).", "",
             "## UnifiReward judge on the held-out SER rows (`eval rm`)", "",
             *judge_table(out), "",
             "## GRPO training", "", *training_table(runs), ""]
    if png:
        lines += [f"![curves]({png.name})", ""]
    lines += ["## Held-out evaluation", "",
              "format: Steps 1-4 all present; reward: the judge's PEER reward of the replies to "
              "the held-out prompts; similarities: embedding cosine (within-prompt is what RUR's "
              "s_group penalises, history what s_hist penalises). ESC-Eval, SAGE and safety are "
              "judged by the chain's judge party (SmolLM2-135M-Instruct in the smollm2 chain: a "
              "weak judge).", "", *held_out_table(out), "", *safety_table(out)]
    return write_atomic(out / "report.md", "\n".join(lines))
