"""Report figures as PNG (matplotlib): grouped bars for scores side by side, lines for SAGE
emotion trajectories."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from peer_rl.files.out_paths import save_figure
from peer_rl.tracking.plot import pyplot

_SIZE = (8.2, 4.4)


def bars(path: str | Path, title: str, categories: list[str],
         series: dict[str, list[float | None]], y_max: float, y_min: float = 0.0) -> Path:
    """One group of bars per category, one bar per series (None: no bar, marked n/a)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=_SIZE)
    names = list(series)
    width = 0.8 / max(len(names), 1)
    x = np.arange(len(categories))
    for si, name in enumerate(names):
        pos = x - 0.4 + width * (si + 0.5)
        values = series[name]
        ax.bar([p for p, v in zip(pos, values) if v is not None],
               [v for v in values if v is not None], width * 0.95, label=name[:30])
        for p, v in zip(pos, values):
            if v is None:
                ax.text(p, y_min, "n/a", ha="center", va="bottom", fontsize=7, color="grey")
    ax.set_xticks(x, [c[:24] for c in categories], fontsize=8)
    ax.set_ylim(y_min, y_max)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=min(4, max(len(names), 1)))
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return Path(path)


def lines(path: str | Path, title: str, series: dict[str, list[float]], y_min: float,
          y_max: float, x_label: str = "turn", legend: bool = True) -> Path:
    """One line per series against its index (0, 1, 2, ...)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=_SIZE)
    for name, ys in series.items():
        ax.plot(range(len(ys)), ys, marker="o", markersize=3, label=name[:30])
    ax.set_ylim(y_min, y_max)
    ax.set_xlabel(x_label)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if legend and series:
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles[:12], labels[:12], fontsize=7, ncol=4)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return Path(path)
