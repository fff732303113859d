"""docs/your-data.md's example rows are the bundled files' first rows, shortened as it says
(strings cut to 60 characters with "...", lists to their first two entries), and every subset
of the bundled sample has one."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "peer_rl" / "bundled" / "data"
PAGE = ROOT / "docs" / "your-data.md"


def _examples() -> dict[str, dict]:
    """{file under the data root: the row shown under its name}."""
    out, name = {}, None
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^`([a-z_]+/[\w/]+\.jsonl)`", line)
        if m:
            name = m.group(1)
        elif name and line.startswith("    {"):
            out[name] = json.loads(line.strip())
            name = None
    return out


def _matches(shown, real) -> bool:
    if isinstance(shown, str):
        return shown == real if len(real) <= 60 else \
            (shown.endswith("...") and real.startswith(shown[:-3]) and len(shown) == 60)
    if isinstance(shown, list):
        return len(shown) == min(2, len(real)) and all(map(_matches, shown, real))
    if isinstance(shown, dict):
        return shown.keys() == real.keys() and all(_matches(shown[k], real[k]) for k in shown)
    return shown == real


def test_every_example_row_is_its_files_first_row_shortened():
    examples = _examples()
    assert len(examples) >= 7
    for name, shown in examples.items():
        real = json.loads((DATA / name).read_text(encoding="utf-8").splitlines()[0])
        assert _matches(shown, real), f"docs/your-data.md: the row shown for {name} is not its first row"


def test_every_bundled_subset_has_an_example():
    subsets = {p.relative_to(DATA).parts[0] for p in DATA.rglob("*.jsonl")}
    shown = {name.split("/")[0] for name in _examples()}
    assert subsets - shown == set(), "docs/your-data.md lacks an example row of these subsets"
