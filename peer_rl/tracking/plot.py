"""PNG figures with matplotlib (Agg backend, no display): training curves next to
metrics.jsonl, and the evaluation reports' bars and lines (peer_rl.evaluation.figures)."""
from __future__ import annotations

import logging
from pathlib import Path

from peer_rl.files.out_paths import DamagedFile, save_figure
from peer_rl.tracking.metrics import read_metrics

log = logging.getLogger(__name__)


def pyplot():
    """matplotlib's pyplot on the file-only backend (safe in Ray workers and on servers)."""
    import matplotlib  # deferred: matplotlib (~1 s); only figures need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib (~1 s); only figures need it

    return plt


def plot_curves(metrics_path: str | Path, keys: list[str], out_path: str | Path,
                title: str = "", width: int = 720, height: int = 420) -> Path | None:
    """Line plot of `keys` (today's names; older files' are mapped, RENAMED) against `step`
    on one shared y axis (at least [0, 1])."""
    try:                              # a torn last line (a crash mid-append) is left out
        recs = read_metrics(metrics_path)
    except DamagedFile as exc:        # a figure is not worth failing a finished run for
        log.warning(f"no curves figure: {exc}")
        return None
    series = {k: [(r["step"], r[k]) for r in recs if isinstance(r.get(k), (int, float))]
              for k in keys}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(width / 100, height / 100))
    for name, pts in series.items():
        ax.plot([s for s, _ in pts], [y for _, y in pts], marker="o", markersize=3, label=name)
    values = [y for pts in series.values() for _, y in pts]
    ax.set_ylim(min(0.0, min(values)), max(1.0, max(values)) * 1.02)
    ax.set_xlabel("step")
    ax.set_title(title or Path(metrics_path).parent.name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()

    save_figure(fig, out_path)
    plt.close(fig)
    return Path(out_path)
