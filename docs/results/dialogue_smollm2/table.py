"""The per-step table of the SmolLM2 dialogue run in docs/dialogues.md, from the run's
metrics.jsonl beside this file; redraws curves.png here with the run's own figure code.
Run: .venv/bin/python docs/results/dialogue_smollm2/table.py"""
import json
from pathlib import Path

from peer_rl.trainer.figures import CURVES
from peer_rl.tracking.plot import plot_curves

HERE = Path(__file__).parent
COLUMNS = [("step", "step", "{:d}"), ("turns", "dialogue/turns_mean", "{:.2f}"),
           ("emotion end", "dialogue/emotion_end", "{:.1f}"),
           ("emotion mean", "dialogue/emotion_mean", "{:.1f}"),
           ("turn 1 / 2 / 3 reward", ("dialogue/turn1_reward", "dialogue/turn2_reward",
                                      "dialogue/turn3_reward"), "{:.2f}"),
           ("format", "reward/format_rate", "{:.2f}"), ("reply tokens", "response/length_mean",
                                                       "{:.0f}"),
           ("step s", "timing_s/step", "{:.0f}")]


def cell(rec: dict, key, fmt: str) -> str:
    if isinstance(key, tuple):
        return " / ".join(fmt.format(rec[k]) if k in rec else "-" for k in key)
    return fmt.format(rec[key]) if key in rec else "-"


if __name__ == "__main__":
    recs = [json.loads(x) for x in (HERE / "metrics.jsonl").read_text().splitlines() if x]
    print("| " + " | ".join(c for c, _, _ in COLUMNS) + " |")
    print("|" + " --- |" * len(COLUMNS))
    for r in recs:
        print("| " + " | ".join(cell(r, k, f) for _, k, f in COLUMNS) + " |")
    plot_curves(HERE / "metrics.jsonl", CURVES, HERE / "curves.png",
                title="dialogue_smollm2: GRPO over dialogues (machinery, not the method)")
