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


def plot_curves(metrics_path: str | Path, panels: dict[str, list[str]], out_path: str | Path,
                title: str = "", width: int = 720) -> Path | None:
    """Line plots of metrics.jsonl against `step`, one panel per y-axis label in `panels`
    (label -> keys, today's names; older files' are mapped, RENAMED), so a 0-3 reward and the
    0-1 rates do not share an axis. None when no key has a value."""
    try:                              # a torn last line (a crash mid-append) is left out
        recs = read_metrics(metrics_path)
    except DamagedFile as exc:        # a figure is not worth failing a finished run for
        log.warning(f"no curves figure: {exc}")
        return None
    fig = curves_figure(recs, panels, title or Path(metrics_path).parent.name, width)
    if fig is None:
        return None
    save_figure(fig, out_path)
    pyplot().close(fig)
    return Path(out_path)


def curves_figure(recs: list[dict], panels: dict[str, list[str]], title: str, width: int = 720):
    """The figure of plot_curves (a matplotlib Figure), or None when nothing is plotted: a panel
    per label that has a value, whole-number step ticks, a rate panel (its label says "rate")
    held to [0, 1]."""
    from matplotlib.ticker import MaxNLocator  # deferred: matplotlib (~1 s); only figures need it

    series = {label: {k: [(r["step"], r[k]) for r in recs if isinstance(r.get(k), (int, float))
                          and not isinstance(r.get(k), bool)] for k in keys}
              for label, keys in panels.items()}
    series = {label: {k: pts for k, pts in by_key.items() if pts}
              for label, by_key in series.items()}
    series = {label: by_key for label, by_key in series.items() if by_key}
    if not series:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(len(series), 1, sharex=True, squeeze=False,
                             figsize=(width / 100, 1.2 + 2.4 * len(series)))
    for ax, (label, by_key) in zip(axes[:, 0], series.items()):
        for name, pts in by_key.items():
            ax.plot([s for s, _ in pts], [y for _, y in pts], marker="o", markersize=3,
                    label=name)
        if "rate" in label:
            ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].set_title(title)
    fig.tight_layout()
    return fig
