"""SAGE: a simulated seeker with a hidden theme starts at emotion 40; after each supporter turn it
writes its inner reaction and an integer change in [-10, 10]; the dialogue stops at 100, below
10, when the seeker says goodbye, or after 10 supporter turns. The final emotion is the
"sentient score"; reaching 100 is a success; bands S >= 100, A >= 70, B >= 40, C >= 10, F < 10.

An unparseable change counts as 0 and is recorded (`change_unparsed`), so one bad answer
neither ends nor skews the dialogue silently.
"""
from __future__ import annotations

from peer_rl.algos.emotion import EmotionRules, emotion_end, next_emotion
from peer_rl.evaluation.endpoints import Request
from peer_rl.prompts.answers import json_field, is_goodbye, parse_int, value_counts
from peer_rl.prompts.seeker import (CHANGE_SCHEMA, sage_analyse_messages, sage_persona,
                                    sage_reply_messages, seeker_line)
from peer_rl.evaluation.supporter import supporter_turn, turn_record

BANDS = (("S", 100), ("A", 70), ("B", 40), ("C", 10), ("F", float("-inf")))


def band(emotion: float) -> str:
    return next(name for name, floor in BANDS if emotion >= floor)


def sage_case(profile, style: str, start: int = 40, max_turns: int = 10, rag_k: int = 0):
    lang = profile.language
    persona = sage_persona(profile, lang)
    rules = EmotionRules(start=start)
    emotion, trajectory = start, [start]
    history = [{"role": "seeker", "content": profile.first_talk}]
    turns, end = [], "max_turns"
    for _ in range(max_turns):
        model_turn = (yield from supporter_turn(style, history, lang, rag_k=rag_k))[0]
        history.append({"role": "supporter", "content": model_turn.shown})
        analysis = (yield "seeker", Request(sage_analyse_messages(persona, history, emotion, lang),
                                            schema=CHANGE_SCHEMA))[0]
        change = parse_int(analysis, "change", -10, 10, ("变化", "情绪变化"))
        reaction = json_field(analysis, "reaction")
        reaction = reaction if isinstance(reaction, str) else analysis
        emotion = next_emotion(emotion, change, rules)
        trajectory.append(emotion)
        turn = {**turn_record(model_turn), "analysis": analysis,
                "change": change, "emotion": emotion}
        turns.append(turn)
        if emotion_end(emotion, rules):
            end = emotion_end(emotion, rules)
            break
        texts = yield "seeker", Request(sage_reply_messages(persona, history, emotion, reaction,
                                                            lang))
        seeker = seeker_line(texts[0])
        turn["seeker"] = seeker
        history.append({"role": "seeker", "content": seeker})
        if is_goodbye(seeker):
            end = "goodbye"
            break
    return {"language": lang, "first_talk": profile.first_talk, "turns": turns,
            "trajectory": trajectory, "final_emotion": emotion, "end": end,
            "change_unparsed": sum(t["change"] is None for t in turns)}


def summarise_sage(records: list[dict]) -> dict:
    ok = [r for r in records if "error" not in r]
    finals = [r["final_emotion"] for r in ok]
    bands = {name: sum(band(f) == name for f in finals) for name, _ in BANDS}
    ends: dict[str, int] = {}
    for r in ok:
        ends[r["end"]] = ends.get(r["end"], 0) + 1
    n_turns = [len(r["turns"]) for r in ok]
    fmt = [t["format_ok"] for r in ok for t in r["turns"] if t["format_ok"] is not None]
    return {"protocol": "sage", "cases": len(records), "errors": len(records) - len(ok),
            "error_ids": [r["id"] for r in records if "error" in r],
            "sentient_score": sum(finals) / len(finals) if finals else None,
            "success_rate": sum(f >= 100 for f in finals) / len(finals) if finals else None,
            "bands": bands, "ends": ends,
            "mean_turns": sum(n_turns) / len(n_turns) if n_turns else None,
            "change_unparsed": sum(r["change_unparsed"] for r in ok),
            "changes_asked": sum(n_turns),
            "changes": value_counts(t["change"] for r in ok for t in r["turns"]),
            "format_rate": sum(fmt) / len(fmt) if fmt else None,
            "trajectories": {r["id"]: r["trajectory"] for r in ok}}
