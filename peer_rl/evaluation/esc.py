"""ESC-Eval: a role card starts a simulated seeker; five rounds of seeker and supporter; then the
judge scores the supporter on seven dimensions, 0-4, one prompt per dimension.

Reported per dimension: the mean over the dialogues whose score parsed, the count that did not,
and the mean mapped to 0-100 (mean / 4 x 100, the range of the ESC-Eval figures the PEER paper
quotes; the rubric is this project's own wording, so the numbers compare only between runs with
the same judge). The average is over the dialogues whose seven scores all parsed (the mean of
their seven dimension means); the others are counted with the dimensions they lack.
"""
from __future__ import annotations

from peer_rl.evaluation.endpoints import Request
from peer_rl.prompts.answers import (by_language, complete_cases, mean, parse_int,
                                      value_counts)
from peer_rl.evaluation.prompts import DIMENSIONS, SCORE_SCHEMA, esc_judge_messages
from peer_rl.prompts.seeker import esc_persona, seeker_line, seeker_messages
from peer_rl.evaluation.supporter import supporter_turn, turn_record


def esc_case(card, style: str, rounds: int = 5, rag_k: int = 0):
    lang = card.language
    persona = esc_persona(card.base, lang)
    history: list[dict] = []
    turns = []
    for _ in range(rounds):
        texts = yield "seeker", Request(seeker_messages(persona, history, lang))
        seeker = seeker_line(texts[0])
        history.append({"role": "seeker", "content": seeker})
        turn = (yield from supporter_turn(style, history, lang, rag_k=rag_k))[0]
        history.append({"role": "supporter", "content": turn.shown})
        turns.append({"seeker": seeker, **turn_record(turn)})
    answers = yield "judge", [Request(esc_judge_messages(d, history, lang), schema=SCORE_SCHEMA)
                              for d in DIMENSIONS]
    scores = {d: parse_int(a[0], "score", 0, 4, ("分数", "评分")) for d, a in zip(DIMENSIONS, answers)}
    return {"language": lang, "turns": turns, "scores": scores,
            "judge_raw": {d: a[0] for d, a in zip(DIMENSIONS, answers)}}


def summarise_esc(records: list[dict]) -> dict:
    ok = [r for r in records if "error" not in r]
    dims = {}
    for d in DIMENSIONS:
        vals = [r["scores"][d] for r in ok if r["scores"][d] is not None]
        m = mean(vals)
        dims[d] = {"mean": m, "scaled": None if m is None else m / 4 * 100,
                   "n": len(vals), "unparsed": len(ok) - len(vals)}
    complete, incomplete = complete_cases(ok, DIMENSIONS)
    avg = mean(r["scores"][d] for r in complete for d in DIMENSIONS)
    fmt = [t["format_ok"] for r in ok for t in r["turns"] if t["format_ok"] is not None]
    by_lang = by_language(ok, DIMENSIONS)
    return {"protocol": "esc", "cases": len(records), "errors": len(records) - len(ok),
            "error_ids": [r["id"] for r in records if "error" in r],
            "dimensions": dims, "average": avg,
            "average_scaled": None if avg is None else avg / 4 * 100,
            "complete": len(complete), **incomplete,
            "judge_unparsed": sum(v["unparsed"] for v in dims.values()),
            "judge_scores": value_counts(r["scores"][d] for r in ok for d in DIMENSIONS),
            "format_rate": mean(fmt), "by_language": by_lang}
