"""`peer-rl data preference --out OUT`: ESCRAG-R1's ESC-Preference construction.

From each seed situation (an ESC-Eval-style role card) a client and a counsellor talk for
`preference.turns` rounds. Each round the client party speaks (the ESC-Eval seeker prompt,
one short sentence per turn as ESCRAG-R1's client), then, as ESCRAG-R1 builds its candidates,
stage by stage (`preference.stagewise`, default): for each counselling stage (context,
psychological state, strategy) the counsellor writes `preference.stage_candidates` notes
given the notes kept so far and the judge keeps the one that fits best; the counsellor then
writes `preference.candidates` replies that follow the kept notes. (With stagewise=false
each candidate writes all three stages and its reply in one answer.) The judge party scores
every reply from the Client, Counselor and Judge perspectives (the CCJ evaluation's prompts,
0-10, a perspective's score the mean of its dimensions): the final preference filtering.
Dominance-based selection: candidate a dominates b when a scores at least b from every
perspective and more from one; the chosen reply is the non-dominated candidate with the
highest total, the rejected one the lowest-scoring candidate it dominates, kept when the
totals differ by `preference.min_margin` or more. The dialogue goes on with the chosen reply
(the best total when no pair formed). OUT gets `preference/{train,test}.jsonl` (the schema the
ESCRAG-R1 reward model reads, with the scores) and `exemplars/{train,test}.jsonl` (chosen
replies with their strategy: the retrieval corpus); dialogues go to test by a seeded hash.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from peer_rl.data.escrag import PERSPECTIVES
from peer_rl.datajobs import job
from peer_rl.datajobs.parse import parse_candidate, parse_note, parse_pick, parse_reply
from peer_rl.datajobs.prompts import (CANDIDATE_SCHEMA, NOTE_SCHEMA, REPLY_SCHEMA, STAGES,
                                      counselor_messages, pick_messages, pick_schema,
                                      reply_messages, stage_messages)
from peer_rl.evaluation.cases import load_role_cards
from peer_rl.evaluation.config import SAMPLE_EVAL
from peer_rl.evaluation.endpoints import Request
from peer_rl.prompts.answers import is_goodbye, parse_int, strip_think
from peer_rl.evaluation.prompts import CCJ_PERSPECTIVES, ccj_messages, ccj_schema
from peer_rl.prompts.seeker import esc_persona, seeker_messages
from peer_rl.evaluation.store import RunStore
from peer_rl.files.out_paths import claim_dir

SOURCE = "peer-rl data preference"


def dominates(a: dict, b: dict) -> bool:
    return all(a[p] >= b[p] for p in PERSPECTIVES) and any(a[p] > b[p] for p in PERSPECTIVES)


def select_pair(scores: list[dict | None], min_margin: float) -> tuple[int, int | None]:
    """(chosen, rejected) candidate indices; rejected is None when no candidate is dominated
    by the chosen one with the margin. Candidates scored None (unparsed) take no part."""
    valid = [i for i, s in enumerate(scores) if s is not None]
    total = {i: sum(scores[i].values()) for i in valid}
    front = [i for i in valid if not any(dominates(scores[j], scores[i]) for j in valid)]
    chosen = max(front, key=lambda i: (total[i], -i))
    beaten = [i for i in valid if dominates(scores[chosen], scores[i])
              and total[chosen] - total[i] >= min_margin]
    return chosen, (min(beaten, key=lambda i: (total[i], i)) if beaten else None)


def perspective_scores(answers: list[str]) -> dict | None:
    """The three perspectives' answers -> {client, counselor, judge} means; None if any
    dimension did not parse."""
    out = {}
    for p, raw in zip(PERSPECTIVES, answers):
        vals = [parse_int(raw, d, 0, 10) for d in CCJ_PERSPECTIVES[p]]
        if None in vals:
            return None
        out[p] = sum(vals) / len(vals)
    return out


@dataclass(frozen=True)
class SeedCase:
    id: str
    language: str
    situation: str


def stagewise_candidates(history: list[dict], lang: str, candidates: int, per_stage: int,
                         counts: Counter, unparsed: list, turn: int):
    """ESCRAG-R1's stage-wise selection: a note per stage, kept by the judge among
    `per_stage`, then `candidates` replies following the kept notes. Returns the candidates
    ({context, state, strategy, reply}), [] when no reply parsed, None when a stage failed
    (its note or the judge's pick did not parse: counted under that stage)."""
    notes: dict[str, str] = {}
    for stage in STAGES:
        texts = yield "counselor", Request(stage_messages(history, lang, stage, notes),
                                           n=per_stage, schema=NOTE_SCHEMA)
        options = [o for o in (parse_note(x) for x in texts) if o is not None]
        unparsed += [{"turn": turn, "role": "counselor", "stage": stage, "answer": x}
                     for x in texts if parse_note(x) is None]
        if not options:
            counts["rounds without a stage note"] += 1
            return None
        if len(options) == 1:
            notes[stage] = options[0]
            continue
        raw = (yield "judge", Request(pick_messages(history, lang, stage, notes, options),
                                      schema=pick_schema(len(options))))[0]
        pick = parse_pick(raw, len(options))
        if pick is None:
            unparsed.append({"turn": turn, "role": "judge", "stage": stage, "answer": raw})
            counts["rounds without a stage pick"] += 1
            return None
        notes[stage] = options[pick]
        counts["stage picks"] += 1
    texts = yield "counselor", Request(reply_messages(history, lang, notes), n=candidates,
                                       schema=REPLY_SCHEMA)
    replies = _parsed(texts, parse_reply, counts, unparsed, turn)
    return [{**notes, "reply": r} for r in replies]


def oneshot_candidates(history: list[dict], lang: str, candidates: int, counts: Counter,
                       unparsed: list, turn: int):
    """Each candidate writes the three stages and its reply in one answer."""
    texts = yield "counselor", Request(counselor_messages(history, lang), n=candidates,
                                       schema=CANDIDATE_SCHEMA)
    return _parsed(texts, parse_candidate, counts, unparsed, turn)


def _parsed(texts: list[str], parse, counts: Counter, unparsed: list, turn: int) -> list:
    """The counsellor's candidates that parse; the others set aside and counted."""
    out = [parse(x) for x in texts]
    unparsed += [{"turn": turn, "role": "counselor", "answer": x}
                 for x, c in zip(texts, out) if c is None]
    counts["candidates"] += len(out)
    counts["candidates_unparsed"] += sum(c is None for c in out)
    return [c for c in out if c is not None]


def preference_case(case: SeedCase, turns: int, candidates: int, min_margin: float,
                    stagewise: bool = True, stage_candidates: int = 3):
    lang, history, rounds = case.language, [], []
    persona = esc_persona(case.situation, lang, length="sentence")   # ESCRAG-R1's client
    counts = Counter()
    unparsed = []         # raw answers that gave no candidate or no score: kept to be read
    for t in range(turns):
        said = strip_think((yield "client", Request(seeker_messages(persona, history, lang)))[0])
        if not said.strip():
            counts["empty client turn"] += 1
            break
        history.append({"role": "seeker", "content": said.strip()})
        ok = yield from (
            stagewise_candidates(history, lang, candidates, stage_candidates, counts, unparsed,
                                 t + 1) if stagewise
            else oneshot_candidates(history, lang, candidates, counts, unparsed, t + 1))
        if ok is None:
            break
        if not ok:
            counts["rounds without a parsed candidate"] += 1
            break
        answers = yield "judge", [Request(ccj_messages(p, history, c["reply"], lang),
                                          schema=ccj_schema(p)) for c in ok for p in PERSPECTIVES]
        k = len(PERSPECTIVES)
        scores = [perspective_scores([a[0] for a in answers[i * k:(i + 1) * k]])
                  for i in range(len(ok))]
        unparsed += [{"turn": t + 1, "role": "judge", "answer": [a[0] for a in
                                                                answers[i * k:(i + 1) * k]]}
                     for i, sc in enumerate(scores) if sc is None]
        counts["candidates_unscored"] += sum(s is None for s in scores)
        if all(s is None for s in scores):
            counts["rounds without a scored candidate"] += 1
            break
        chosen, rejected = select_pair(scores, min_margin)
        rounds.append({"history": [dict(x) for x in history], "candidates": ok,
                       "scores": scores, "chosen": chosen, "rejected": rejected})
        counts["pairs" if rejected is not None else "rounds without dominance"] += 1
        history.append({"role": "supporter", "content": ok[chosen]["reply"]})
        if is_goodbye(said):
            break
    return {"language": lang, "rounds": rounds, "counts": dict(counts), "unparsed": unparsed}


def split_of(case_id: str, seed: int, test_fraction: float) -> str:
    h = int.from_bytes(hashlib.sha256(f"{seed}:{case_id}".encode()).digest()[:8], "big")
    return "test" if h / 2**64 < test_fraction else "train"


def run_preference(out: str | Path, cfg, endpoints=None) -> dict:
    out = Path(out)
    seeds = Path(cfg.preference.seeds or SAMPLE_EVAL / "esc_cards.json")
    claim_dir(out, "data preference", [seeds], resume=True,
              run_state="_jobs/preference/run.json")    # a rerun continues its run
    loaded = load_role_cards(seeds, cfg.skip_invalid)
    cards = loaded.items[:cfg.limit] if cfg.limit else loaded.items
    cases = [SeedCase(c.id, c.language, c.base) for c in cards]
    manifest = job.manifest("preference", cfg, {"seeds": str(seeds), "sha256": job.sha256(seeds)},
                            job.section(cfg, "preference"))
    directory = job.job_dir(out, "preference")
    store = RunStore(directory, manifest)
    p = cfg.preference
    job.run_job("preference", cfg, cases, partial(preference_case, turns=p.turns,
                                                  candidates=p.candidates,
                                                  min_margin=p.min_margin,
                                                  stagewise=p.stagewise,
                                                  stage_candidates=p.stage_candidates), store,
                endpoints)
    pairs = {"train": [], "test": []}
    exemplars = {"train": [], "test": []}
    for c in cases:
        rec = store.records[c.id]
        split = split_of(c.id, cfg.seed, p.test_fraction)
        for t, rnd in enumerate(rec.get("rounds", [])):
            chosen = rnd["candidates"][rnd["chosen"]]
            base = {"language": rec["language"], "history": rnd["history"], "source": SOURCE,
                    "dialogue": c.id}            # retrieval never returns its own dialogue
            exemplars[split].append({"id": f"{c.id}-t{t + 1}", **base,
                                     "response": chosen["reply"],
                                     "strategy": chosen["strategy"] or "unstated"})
            if rnd["rejected"] is None:
                continue
            rejected = rnd["candidates"][rnd["rejected"]]
            if rejected["reply"] == chosen["reply"]:
                continue
            pairs[split].append({"id": f"{c.id}-t{t + 1}", **base, "chosen": chosen["reply"],
                                 "rejected": rejected["reply"],
                                 "scores": {"chosen": rnd["scores"][rnd["chosen"]],
                                            "rejected": rnd["scores"][rnd["rejected"]]}})
    for split in ("train", "test"):
        job.write_lines(out / "preference" / f"{split}.jsonl", job.jsonl(pairs[split]))
        job.write_lines(out / "exemplars" / f"{split}.jsonl", job.jsonl(exemplars[split]))
    summary = summarise([store.records[c.id] for c in cases], pairs, exemplars, loaded.skipped)
    figures = [job.bar_figure(directory / "preference_rounds.png", "rounds by outcome",
                              summary["round_outcomes"], "rounds")]
    return job.write_report(directory, "data preference", summary, manifest, _tables(summary),
                            figures)


def summarise(records: list[dict], pairs: dict, exemplars: dict, skipped) -> dict:
    counts = Counter()
    for r in records:
        counts.update(r.get("counts", {}))
    errors = [r["id"] for r in records if "error" in r]
    margins = [sum(p["scores"]["chosen"].values()) - sum(p["scores"]["rejected"].values())
               for split in pairs.values() for p in split]
    return {"dialogues": len(records), "errors": len(errors), "error_ids": errors,
            "skipped_seeds": skipped,
            "pairs": {s: len(v) for s, v in pairs.items()},
            "exemplars": {s: len(v) for s, v in exemplars.items()},
            "candidates": counts["candidates"],
            "candidates_unparsed": counts["candidates_unparsed"],
            "candidates_unscored": counts["candidates_unscored"],
            "round_outcomes": {"pair": counts["pairs"],
                               "no dominance": counts["rounds without dominance"],
                               "no parsed candidate": counts["rounds without a parsed candidate"],
                               "no scored candidate": counts["rounds without a scored candidate"],
                               "no stage note": counts["rounds without a stage note"],
                               "no stage pick": counts["rounds without a stage pick"]},
            "stage_picks": counts["stage picks"],
            "mean_margin": sum(margins) / len(margins) if margins else None}


def _tables(s: dict) -> list[str]:
    head = job.table(["dialogues", "errors", "pairs (train / test)", "exemplars (train / test)",
                      "candidates", "unparsed", "unscored", "mean margin"],
                     [[s["dialogues"], s["errors"], f"{s['pairs']['train']} / {s['pairs']['test']}",
                       f"{s['exemplars']['train']} / {s['exemplars']['test']}", s["candidates"],
                       s["candidates_unparsed"], s["candidates_unscored"],
                       s["mean_margin"] if s["mean_margin"] is not None else "-"]])
    outcomes = job.table(["round outcome", "rounds"], [[k, v] for k, v in s["round_outcomes"].items()])
    return [head, outcomes]
