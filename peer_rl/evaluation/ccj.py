"""ESCRAG-R1's Client-Counselor-Judge evaluation: the model under test answers a dialogue
context once (two passes with retrieval under RAG inference); the judge endpoint then reads the
reply from three perspectives, one request each, and scores 0-10 per dimension:
Client (Emotional Impact, Non-Lecturing Empathy, Therapeutic Alliance), Counselor (Strategic
Coherence, Theoretical Application), Judge (Strategy-Client Fit, Problem Targeting).

Reported: per dimension the mean over the contexts whose score parsed and how many did not;
over the contexts whose seven scores all parsed (the others counted with the dimensions they
lack), per perspective the mean of its dimensions, the headline `average`: the mean of the three
perspectives (the paper's average across the Client, Counselor and Judge perspectives, 8.63 for
ESCRAG-R1-7B with RAG), and beside it `dimension_average`, the mean of the seven dimensions,
which weighs the Client's three dimensions 3/7 instead of 1/3.
"""
from __future__ import annotations

from peer_rl.evaluation.endpoints import Request
from peer_rl.prompts.answers import (by_language, complete_cases, mean, parse_int,
                                      value_counts)
from peer_rl.evaluation.prompts import CCJ_DIMENSIONS, CCJ_PERSPECTIVES, ccj_messages, ccj_schema
from peer_rl.evaluation.supporter import supporter_turn, turn_record


def ccj_case(context, style: str, rag_k: int = 0):
    history, lang = list(context.history), context.language
    turn = (yield from supporter_turn(style, history, lang, rag_k=rag_k))[0]
    perspectives = list(CCJ_PERSPECTIVES)
    answers = yield "judge", [Request(ccj_messages(p, history, turn.shown, lang),
                                      schema=ccj_schema(p)) for p in perspectives]
    raw = {p: a[0] for p, a in zip(perspectives, answers)}
    scores = {d: parse_int(raw[p], d, 0, 10) for p in perspectives for d in CCJ_PERSPECTIVES[p]}
    return {"language": lang, "history": history, **turn_record(turn), "scores": scores,
            "judge_raw": raw}



def summarise_ccj(records: list[dict]) -> dict:
    ok = [r for r in records if "error" not in r]
    dims = {}
    for d in CCJ_DIMENSIONS:
        vals = [r["scores"][d] for r in ok if r["scores"][d] is not None]
        dims[d] = {"mean": mean(vals), "n": len(vals), "unparsed": len(ok) - len(vals)}
    complete, incomplete = complete_cases(ok, CCJ_DIMENSIONS)
    perspectives = {p: mean(r["scores"][d] for r in complete for d in ds)
                    for p, ds in CCJ_PERSPECTIVES.items()}
    fmt = [r["format_ok"] for r in ok if r["format_ok"] is not None]
    by_lang = by_language(ok, CCJ_DIMENSIONS)
    return {"protocol": "ccj", "cases": len(records), "errors": len(records) - len(ok),
            "error_ids": [r["id"] for r in records if "error" in r],
            "dimensions": dims, "perspectives": perspectives,
            "average": mean(perspectives.values()) if complete else None,
            "dimension_average": mean(r["scores"][d] for r in complete for d in CCJ_DIMENSIONS),
            "complete": len(complete), **incomplete,
            "judge_unparsed": sum(v["unparsed"] for v in dims.values()),
            "judge_scores": value_counts(r["scores"][d] for r in ok for d in CCJ_DIMENSIONS),
            "format_rate": mean(fmt),
            "rag": any("exemplars" in r for r in ok),
            "by_language": by_lang}
