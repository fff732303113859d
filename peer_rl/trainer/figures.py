"""A run's figures, drawn from the files it wrote (no worker needed): curves.png (rewards,
format and parse-failure rates; with dialogues, the seeker's emotion and how dialogues ended)
and timeline.png (the stages of the last steps). The controller
draws them after every checkpoint and at the end, so a run that dies has the figures of its
last checkpoint; `peer-rl plot RUN_DIR --out DIR` draws them again from a run directory."""
from __future__ import annotations

from pathlib import Path

from peer_rl.tracking.plot import plot_curves
from peer_rl.trainer.timeline import plot_timeline

METRICS_FILE = "metrics.jsonl"
TIMELINE_FILE = "timeline.jsonl"  # every stage's wall-clock span, per step
# curves.png's panels: label -> the metrics drawn in it (rewards 0-3 apart from 0-1 rates);
# a panel with no value (the dialogue ones, outside dialogue training) is left out
CURVES = {"reward": ["reward/mean", "reward/rur_mean"],
          "rate": ["reward/format_rate", "judge/parse_failure_rate"],
          "seeker's emotion": ["dialogue/emotion_end", "dialogue/emotion_mean"],
          "dialogue end rate": ["dialogue/end_success", "dialogue/end_failure",
                                "dialogue/end_goodbye", "dialogue/end_max_turns",
                                "dialogue/end_length"]}


def draw_figures(run_dir: Path, out_dir: Path, experiment: str, staleness: int) -> list[Path]:
    """curves.png and timeline.png of the run in `run_dir`, written whole into `out_dir`; the
    paths drawn (a figure with nothing to draw is left out)."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    mode = f"staleness {staleness}" if staleness else "synchronous"
    drawn = [plot_curves(run_dir / METRICS_FILE, CURVES, out_dir / "curves.png",
                         title=f"{experiment}: GRPO"),
             plot_timeline(run_dir / TIMELINE_FILE, out_dir / "timeline.png",
                           title=f"{experiment}: stages of the last steps ({mode})")]
    return [p for p in drawn if p is not None]
