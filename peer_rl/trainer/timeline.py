"""When each stage of each step ran: spans for the overlap metrics and a PNG timeline.

`Timing` is the per-step dict of stage durations the metrics report; assigning a duration at a
stage's end also records the stage's wall-clock span, so the stages need no second clock. With
trainer.async_training the spans of step t+1's rollout, judging and redundancy lie inside step
t's update, which is what `overlap` measures and the PNG shows.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from peer_rl.files.out_paths import DamagedFile, open_append, read_jsonl, save_figure
from peer_rl.tracking.plot import pyplot

log = logging.getLogger(__name__)


class Timing(dict):
    """{stage: seconds} of one step; `spans` holds (stage, start, end) in wall-clock time."""

    def __init__(self, step: int):
        super().__init__()
        self.step = step
        self.spans: list[dict] = []

    def __setitem__(self, stage: str, seconds: float) -> None:
        super().__setitem__(stage, seconds)
        end = time.time()
        self.spans.append({"step": self.step, "stage": stage, "start": end - seconds, "end": end})

    def absorb(self, other: "Timing") -> None:
        """Another pass of the same stages in this step (dynamic sampling's refills): the
        durations add up, every span is kept."""
        for stage, seconds in other.items():
            super().__setitem__(stage, self.get(stage, 0.0) + seconds)
        self.spans += other.spans


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def covered(spans: list[dict], start: float, end: float) -> float:
    """Seconds of [start, end] during which at least one span ran."""
    clipped = [(max(s["start"], start), min(s["end"], end)) for s in spans]
    return sum(b - a for a, b in _merge([(a, b) for a, b in clipped if b > a]))


def overlap(inner: list[dict], outer: dict) -> float:
    """Seconds of the `inner` spans that ran while `outer` ran."""
    return covered(inner, outer["start"], outer["end"])


def append_spans(path: Path, spans: list[dict]) -> None:
    with open_append(path) as fh:
        for s in spans:
            fh.write(json.dumps(s) + "\n")


def plot_timeline(spans_path: Path, out_path: Path, last_steps: int = 4,
                  title: str = "") -> Path | None:
    """One row per stage, one bar per span, for the last `last_steps` steps (labelled by step)."""
    if not spans_path.exists():
        return None

    try:                                  # a torn last line (a crash mid-append) is left out
        spans = read_jsonl(spans_path)[0]
    except DamagedFile as exc:            # a figure is not worth failing a finished run for
        log.warning(f"no timeline figure: {exc}")
        return None
    if not spans:
        return None
    steps = sorted({s["step"] for s in spans})[-last_steps:]
    spans = [s for s in spans if s["step"] in steps]

    plt = pyplot()
    stages = list(dict.fromkeys(s["stage"] for s in spans))
    t0 = min(s["start"] for s in spans)
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(stages) + 1.5))
    for s in spans:
        y = stages.index(s["stage"])
        ax.barh(y, s["end"] - s["start"], left=s["start"] - t0, height=0.6,
                color=colours(steps.index(s["step"]) % 10), edgecolor="black", linewidth=0.5)
        ax.text(s["start"] - t0, y, f" {s['step']}", va="center", fontsize=7)
    ax.set_yticks(range(len(stages)), stages)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (bars labelled with their step)")
    ax.set_title(title or "stages per step")
    fig.tight_layout()
    save_figure(fig, out_path)
    plt.close(fig)
    return out_path
