"""The judge table of docs/results.md, recomputed from the `eval rm` reports beside this file
(each holds the judge's answers per chat); the balanced accuracy is worked out from those
answers, as `eval rm` now reports it. Run: .venv/bin/python docs/results/smollm2_judge/table.py"""
import json
import statistics
from pathlib import Path

from peer_rl.data.bundled import sample_root
from peer_rl.data.loading import load_subset
from peer_rl.evaluation.rm import Verdicts, grouped_metrics

HERE = Path(__file__).parent
RUNS = [("fine-tuned, seed 0 (shipped), step 76", "judge_s0.json"),
        ("fine-tuned, seed 1, step 76", "judge_s1.json"),
        ("seed 1 at step 19", "judge_s1_step19.json"),
        ("seed 1 at step 38", "judge_s1_step38.json"),
        ("seed 1 at step 57", "judge_s1_step57.json"),
        ("untuned SmolLM2-Instruct", "untuned.json")]


def metrics(report: dict) -> dict:
    rows = {}
    for pattern in ("en/text_test", "en/visual_test"):
        for r in load_subset(sample_root(), "ser", pattern).dataset:
            rows[(str(r["id"]), "visual" if r.get("images") else "text")] = r
    chats = [rows[(s["id"], s["group"].split("/")[1])] for s in report["samples"]]
    return grouped_metrics(chats, [Verdicts.parse(s["answers"]) for s in report["samples"]])["all"]


def line(name: str, m: dict) -> str:
    f = lambda v: "-" if v is None else f"{v:.3f}"            # noqa: E731
    three = lambda d: " / ".join(f(d[k]) for k in ("step1", "step2", "step3"))  # noqa: E731
    return (f"| {name} | {three(m['step_accuracy'])} | {f(m['step_accuracy_mean'])} | "
            f"{three(m['error_recall'])} | {f(m['error_recall_mean'])} | "
            f"{three(m['balanced_accuracy'])} | {f(m['balanced_accuracy_mean'])} | "
            f"{f(m['preference_accuracy'])} | {f(m['parse_failure_rate'])} |")


if __name__ == "__main__":
    got = {}
    for name, file in RUNS:
        report = json.loads((HERE / file).read_text())
        got[name] = metrics(report)
        print(line(name, got[name]))
    print(line("majority label (True, True, True; second better)", metrics(
        {"samples": [{**s, "answers": ["True", "True", "True", "The second sentence is better"]}
                     for s in report["samples"]]})))
    for key in ("step_accuracy_mean", "error_recall_mean", "balanced_accuracy_mean",
                "preference_accuracy"):
        v = [got[n][key] for n, _ in RUNS[:2]]
        print(f"{key}: {statistics.mean(v):.3f} +- {statistics.stdev(v):.3f} (2 seeds)")
