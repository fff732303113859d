"""A dependency-free PNG of training curves (PIL only), written next to metrics.jsonl."""
from __future__ import annotations

import json
from pathlib import Path

from PIL import Image, ImageDraw

COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14)]


def plot_curves(metrics_path: str | Path, keys: list[str], out_path: str | Path,
                title: str = "", width: int = 720, height: int = 420) -> Path | None:
    """Line plot of `keys` against `step` on one shared y axis (at least [0, 1])."""
    recs = [json.loads(x) for x in Path(metrics_path).read_text().splitlines() if x.strip()]
    series = {k: [(r["step"], r[k]) for r in recs if isinstance(r.get(k), (int, float))] for k in keys}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    steps = [s for v in series.values() for s, _ in v]
    values = [y for v in series.values() for _, y in v]
    x0, x1 = min(steps), max(max(steps), min(steps) + 1)
    y0, y1 = min(0.0, min(values)), max(1.0, max(values))
    img = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(img)
    left, right, top, bottom = 60, width - 20, 40, height - 70
    d.rectangle((left, top, right, bottom), outline=(0, 0, 0))
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        py = bottom - (bottom - top) * i / 4
        d.line((left - 4, py, left, py), fill=(0, 0, 0))
        d.text((8, py - 6), f"{y:.2f}", fill=(0, 0, 0))
    for i in range(6):
        x = x0 + (x1 - x0) * i / 5
        px = left + (right - left) * i / 5
        d.line((px, bottom, px, bottom + 4), fill=(0, 0, 0))
        d.text((px - 8, bottom + 8), f"{x:.0f}", fill=(0, 0, 0))
    d.text((left, 12), title or Path(metrics_path).parent.name, fill=(0, 0, 0))
    d.text(((left + right) // 2 - 12, bottom + 24), "step", fill=(0, 0, 0))

    def to_px(s, y):
        return (left + (right - left) * (s - x0) / (x1 - x0),
                bottom - (bottom - top) * (y - y0) / (y1 - y0))

    for i, (k, pts) in enumerate(series.items()):
        c = COLOURS[i % len(COLOURS)]
        px = [to_px(s, y) for s, y in pts]
        if len(px) > 1:
            d.line(px, fill=c, width=2)
        for p in px:
            d.ellipse((p[0] - 2, p[1] - 2, p[0] + 2, p[1] + 2), fill=c)
        d.text((left + 10 + 170 * i, height - 22), k, fill=c)
    img.save(out_path)
    return Path(out_path)
