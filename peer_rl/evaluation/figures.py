"""Report figures as PNG with PIL alone (no plotting library in the stack): grouped bars for
scores side by side, lines for SAGE emotion trajectories."""
from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

from peer_rl.plot import COLOURS

_W, _H = 820, 440
_LEFT, _RIGHT, _TOP, _BOTTOM = 60, _W - 20, 40, _H - 90


def _canvas(title: str, y0: float, y1: float):
    img = Image.new("RGB", (_W, _H), "white")
    d = ImageDraw.Draw(img)
    d.rectangle((_LEFT, _TOP, _RIGHT, _BOTTOM), outline=(0, 0, 0))
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        py = _BOTTOM - (_BOTTOM - _TOP) * i / 4
        d.line((_LEFT - 4, py, _LEFT, py), fill=(0, 0, 0))
        d.line((_LEFT, py, _RIGHT, py), fill=(225, 225, 225))
        d.text((6, py - 6), f"{y:g}", fill=(0, 0, 0))
    d.text((_LEFT, 12), title, fill=(0, 0, 0))
    return img, d


def _y(v: float, y0: float, y1: float) -> float:
    return _BOTTOM - (_BOTTOM - _TOP) * (min(max(v, y0), y1) - y0) / (y1 - y0)


def _legend(d, names: list[str]) -> None:
    for i, name in enumerate(names):
        c = COLOURS[i % len(COLOURS)]
        x = _LEFT + 10 + 200 * (i % 4)
        y = _H - 40 + 16 * (i // 4)
        d.rectangle((x, y + 2, x + 10, y + 12), fill=c)
        d.text((x + 14, y), name[:30], fill=(0, 0, 0))


def bars(path: str | Path, title: str, categories: list[str],
         series: dict[str, list[float | None]], y_max: float, y_min: float = 0.0) -> Path:
    """One group of bars per category, one bar per series (None: no bar, marked n/a)."""
    img, d = _canvas(title, y_min, y_max)
    names = list(series)
    slot = (_RIGHT - _LEFT) / max(len(categories), 1)
    width = slot * 0.8 / max(len(names), 1)
    for ci, cat in enumerate(categories):
        x0 = _LEFT + slot * ci + slot * 0.1
        for si, name in enumerate(names):
            v = series[name][ci]
            bx = x0 + width * si
            if v is None:
                d.text((bx, _BOTTOM - 14), "n/a", fill=(120, 120, 120))
                continue
            d.rectangle((bx, _y(v, y_min, y_max), bx + width - 2, _BOTTOM),
                        fill=COLOURS[si % len(COLOURS)])
        d.text((x0, _BOTTOM + 6), cat[:int(slot / 6)], fill=(0, 0, 0))
    _legend(d, names)
    img.save(path)
    return Path(path)


def lines(path: str | Path, title: str, series: dict[str, list[float]], y_min: float,
          y_max: float, x_label: str = "turn", legend: bool = True) -> Path:
    """One line per series against its index (0, 1, 2, ...)."""
    img, d = _canvas(title, y_min, y_max)
    x_max = max((len(v) - 1 for v in series.values()), default=1) or 1
    for i in range(x_max + 1):
        px = _LEFT + (_RIGHT - _LEFT) * i / x_max
        d.line((px, _BOTTOM, px, _BOTTOM + 4), fill=(0, 0, 0))
        d.text((px - 3, _BOTTOM + 6), str(i), fill=(0, 0, 0))
    d.text(((_LEFT + _RIGHT) // 2 - 10, _BOTTOM + 20), x_label, fill=(0, 0, 0))
    for si, (name, ys) in enumerate(series.items()):
        c = COLOURS[si % len(COLOURS)]
        pts = [(_LEFT + (_RIGHT - _LEFT) * i / x_max, _y(v, y_min, y_max)) for i, v in enumerate(ys)]
        if len(pts) > 1:
            d.line(pts, fill=c, width=2)
        for p in pts:
            d.ellipse((p[0] - 2, p[1] - 2, p[0] + 2, p[1] + 2), fill=c)
    if legend:
        _legend(d, list(series)[:12])
    img.save(path)
    return Path(path)
