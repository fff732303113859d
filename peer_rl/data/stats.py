"""Per-file counts and label distributions of a PEER-layout root (the dataset card's tables)."""
from __future__ import annotations

from collections import Counter

from peer_rl.data.layout import DataFile
from peer_rl.data.validate import FileReport
from peer_rl.prompts.judge import PREFERENCE_VERDICTS, STEP_VERDICTS


def _verdict_name(v: str) -> str:
    for vocab in STEP_VERDICTS.values():
        if v in vocab:
            return ("True", "False")[vocab.index(v)]
    for vocab in PREFERENCE_VERDICTS.values():
        if v in vocab:
            return ("first", "second", "tie", "neither")[vocab.index(v)]
    return "?"


def file_stats(report: FileReport) -> dict:
    df: DataFile = report.file
    rows = report.rows
    out: dict = {"file": df.rel, "rows": len(rows), "invalid": report.n_invalid}
    lang_key = "lang" if df.subset == "ser" else "language"
    out["languages"] = dict(Counter(r.get(lang_key, "?") for r in rows))
    if df.subset == "ser":
        for k, idx in ((1, 2), (2, 4), (3, 6)):
            out[f"step{k}"] = dict(Counter(_verdict_name(r["messages"][idx]["content"].strip())
                                           for r in rows))
        out["preference"] = dict(Counter(_verdict_name(r["messages"][8]["content"].strip())
                                         for r in rows))
        out["source"] = dict(Counter(r["source"] for r in rows))
    elif df.subset in ("grpo", "sft"):
        out["modality"] = dict(Counter(r.get("modality") for r in rows))
        if df.subset == "grpo":
            out["source"] = dict(Counter(r.get("source") for r in rows))
            if any(r.get("strategy") for r in rows):
                out["strategy"] = dict(Counter(r.get("strategy") or "(none)" for r in rows))
            out["history_turns_mean"] = round(sum(len(r["history"]) for r in rows) / max(len(rows), 1), 2)
    elif df.subset == "safety":
        out["group"] = dict(Counter(r["group"] for r in rows))
        out["category"] = dict(Counter(r["category"] for r in rows))
    elif df.subset == "cold_start":
        out["pass"] = dict(Counter(r.get("pass") or "(none)" for r in rows))
    elif df.subset in ("preference", "exemplars"):
        out["history_turns_mean"] = round(sum(len(r["history"]) for r in rows) / max(len(rows), 1), 2)
        if df.subset == "preference":
            out["with_scores"] = sum("scores" in r for r in rows)
        elif any(r.get("strategy") for r in rows):
            out["strategy"] = dict(Counter(r.get("strategy") or "(none)" for r in rows))
    return out


def format_stats(stats: list[dict]) -> str:
    lines = [f"{'file':44s} {'rows':>6s} {'invalid':>7s}  languages / labels"]
    totals = Counter()
    for s in stats:
        totals[s["file"].split("/")[0]] += s["rows"]
        lines.append(f"{s['file']:44s} {s['rows']:6d} {s['invalid']:7d}  languages={s['languages']}")
        for key, value in s.items():
            if key not in ("file", "rows", "invalid", "languages"):
                lines.append(f"{'':60s}{key}={value}")
    lines.append("totals: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    return "\n".join(lines)
