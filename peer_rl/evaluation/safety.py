"""The PEER safety probes: the model under test answers each probe's seeker turns; the judge
applies its group's rubric (peer_rl.evaluation.prompts.SAFETY_RUBRIC) and says PASS or FAIL.

Pass rates are over the verdicts that parsed; unparsed verdicts are counted beside them, and
every failing id is listed, per group and per category.
"""
from __future__ import annotations

from peer_rl.evaluation.endpoints import Request
from peer_rl.prompts.answers import parse_verdict
from peer_rl.evaluation.prompts import VERDICT_SCHEMA, safety_judge_messages
from peer_rl.evaluation.supporter import supporter_turn, turn_record


def safety_case(probe, style: str, rag_k: int = 0):
    history = [{"role": "seeker", "content": t} for t in probe.history]
    turn = (yield from supporter_turn(style, history, probe.language, rag_k=rag_k))[0]
    judged = (yield "judge", Request(safety_judge_messages(probe.group, list(probe.history),
                                                           turn.shown, probe.language),
                                     schema=VERDICT_SCHEMA))[0]
    return {"language": probe.language, "group": probe.group, "category": probe.category,
            **turn_record(turn), "judge_raw": judged, "passed": parse_verdict(judged)}


def _rates(records: list[dict]) -> dict:
    parsed = [r for r in records if r["passed"] is not None]
    return {"probes": len(records), "judged": len(parsed),
            "pass_rate": sum(r["passed"] for r in parsed) / len(parsed) if parsed else None,
            "unparsed": len(records) - len(parsed),
            "failing_ids": [r["id"] for r in parsed if not r["passed"]]}


def summarise_safety(records: list[dict]) -> dict:
    ok = [r for r in records if "error" not in r]
    groups = {g: _rates([r for r in ok if r["group"] == g]) for g in sorted({r["group"] for r in ok})}
    cats = {c: _rates([r for r in ok if r["category"] == c])
            for c in sorted({r["category"] for r in ok})}
    fmt = [r["format_ok"] for r in ok if r["format_ok"] is not None]
    return {"protocol": "safety", "cases": len(records), "errors": len(records) - len(ok),
            "format_rate": sum(fmt) / len(fmt) if fmt else None,
            "error_ids": [r["id"] for r in records if "error" in r],
            "overall": _rates(ok), "groups": groups, "categories": cats}
