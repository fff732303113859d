"""The DISC personas `peer-rl data personas` writes (DIR/personas.jsonl: one record per seeker
with its language, DISC ratings, a description of how it talks and its cluster), read for the
jobs and runs that use them: `data rewrite` (a seeker's dialogue in another persona's voice) and
dialogue training (`dialogue.personas`: how a simulated seeker talks)."""
from __future__ import annotations

import json
from pathlib import Path

PERSONAS_FILE = "personas.jsonl"


def load_personas(directory: str | Path) -> dict[str, dict]:
    """seeker id -> its persona (seeker, cluster, description, language); a malformed line
    fails naming the file and the line."""
    path = Path(directory) / PERSONAS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"--personas {directory}: no {PERSONAS_FILE} there (run "
                                f"`peer-rl data personas ROOT --out {directory}` first)")
    out = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            rec = json.loads(line)
            out[rec["seeker"]] = {"seeker": rec["seeker"], "cluster": rec["cluster"],
                                  "description": rec["description"], "language": rec["language"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: expected a persona record (seeker, cluster, "
                             f"description, language): {exc}") from None
    return out
