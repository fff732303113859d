"""ESC-Preference in peer-rl's layout: preference pairs for the scalar reward model and the
exemplar corpus the ESCRAG-R1 index is built from.

    preference/*.jsonl  {"id", "language", "history", "chosen", "rejected",
                         "scores"?: {"chosen": {"client", "counselor", "judge"},
                                     "rejected": {...}}, "source"?}
    exemplars/*.jsonl   {"id", "language", "history", "response", "strategy"?, "source"?}

`history` takes every spelling the PEER subsets accept (peer_rl.data.vocab) and ends with the
seeker turn that `chosen` / `rejected` / `response` answer; scores are the Client, Counselor and
Judge perspectives' 0-10 ratings where the data has them (the reward model trains on the pair
alone). The bundled sample derives both from the project's own dialogues: a pair per supporter
turn and quality level (the reply vs the worse reply, the equally good alternative vs the
unusable one), and the train dialogues' good replies as exemplars.
"""
from __future__ import annotations

PERSPECTIVES = ("client", "counselor", "judge")


def preference_rows(targets: list[dict], split: str) -> list[dict]:
    rows = []
    for t in (t for t in targets if t["split"] == split):
        base = {"language": t["lang"], "history": t["history"], "source": "peer-rl sample"}
        rows.append({"id": f"{t['id']}-a", **base, "chosen": t["text"], "rejected": t["poor"]})
        rows.append({"id": f"{t['id']}-b", **base, "chosen": t["alt_good"],
                     "rejected": t["unusable"]})
    return rows


def exemplar_rows(targets: list[dict]) -> list[dict]:
    """Good replies of the train dialogues (a test dialogue's reply must not be retrievable)."""
    rows = []
    for t in (t for t in targets if t["split"] == "train"):
        base = {"language": t["lang"], "history": t["history"], "strategy": t["strategy"],
                "source": "peer-rl sample"}
        rows.append({"id": f"{t['id']}-r", **base, "response": t["text"]})
        rows.append({"id": f"{t['id']}-alt", **base, "response": t["alt_good"]})
    return rows
