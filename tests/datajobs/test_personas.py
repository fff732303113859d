"""`data personas` on SER dialogues that open with the same seeker turn, in English and Chinese
(tests/datajobs/ser_dialogues.py): one seeker per dialogue, the writer asked about that
dialogue's messages only. Expected seekers are worked out by hand there."""
import json

import pytest

from evaluation.scripted import Scripted, last_user
from peer_rl.datajobs.config import load_job_config
from peer_rl.datajobs.personas import run_personas

from datajobs.ser_dialogues import TURNS, lines_of, write_root


def _asked_messages(text: str) -> tuple[str, ...]:
    """The seeker's messages a persona request lists (`- message` lines after its heading)."""
    head = next(h for h in ("The seeker's messages:\n", "求助者的话：\n") if h in text)
    return tuple(x[2:] for x in text.split(head, 1)[1].split("\n\n", 1)[0].splitlines())


@pytest.mark.e2e   # run_personas loads the real sentence encoder (personas.embedding_model)
def test_dialogues_that_open_alike_are_two_seekers(tmp_path):
    root = write_root(tmp_path / "in")
    asked = []

    def writer(r):
        asked.append(_asked_messages(last_user(r)))
        return json.dumps({"dominance": 2, "influence": 3, "steadiness": 4, "compliance": 3,
                           "description": "Short plain sentences."})

    cfg = load_job_config("personas", ["writer.url=http://127.0.0.1:9/v1", "personas.k=1"])
    s = run_personas(root, tmp_path / "p", cfg, {"writer": Scripted(writer)})["summary"]
    # per language: the pet dialogue, the job dialogue, and the opener both go on from
    assert s["rows"] == 14 and s["seekers"] == s["personas"] == 6
    assert s["ambiguous_rows"] == 4
    recs = [json.loads(x) for x in
            (tmp_path / "p/personas.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sorted(sorted(r["rows"]) for r in recs) == sorted(
        sorted(lines_of(lang, g)) for lang in ("en", "zh") for g in ("pet", "job", "shared"))
    # the writer read each dialogue's own seeker messages, never two dialogues' together
    expected = {tuple(TURNS[lang][name][0::2]) for lang in TURNS for name in ("pet", "job")}
    expected |= {(TURNS[lang]["pet"][0],) for lang in TURNS}
    assert sorted(asked) == sorted(expected)
