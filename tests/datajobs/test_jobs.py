"""The data jobs end to end on real files with parties whose answers the test writes: what is
tested is the jobs' counting, set-asides, outputs and resumption (the parsers have their own
tests; tests/datajobs/test_jobs_e2e.py runs the same jobs against a real vLLM server)."""
import json
from pathlib import Path

import pytest

from evaluation.scripted import Scripted, last_user
from peer_rl.data.layout import discover
from peer_rl.data.bundled import sample_root
from peer_rl.data.validate import check_file
from peer_rl.datajobs.config import load_job_config
from peer_rl.evaluation.endpoints import EndpointError, Reply

URL = "http://127.0.0.1:9/v1"        # never opened: the tests hand the jobs their parties


def _cfg(job, *extra):
    roles = {"filter": ["judge"], "personas": ["writer"], "rewrite": ["writer", "judge"],
             "preference": ["client", "counselor", "judge"], "cold_start": ["teacher"]}[job]
    return load_job_config(job, [f"{r}.url={URL}" for r in roles] + list(extra))


def _all_valid(root: Path) -> int:
    rows = 0
    for df in discover(root):
        rep = check_file(df)
        assert not rep.problems, rep.problems[:3]
        rows += len(rep.rows)
    return rows


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _dialogue(raw: dict) -> str:
    return " ".join([t["content"] for t in raw["history"]] + [raw["solution"]])


def _verdict(text: str) -> str:
    """The judge's rule: 'friend' -> non-dialogue, 'Friday' -> unparseable, else keep."""
    if "Friday" in text:
        return "I cannot tell."
    flag = "friend" in text
    return json.dumps({"semantic_incoherence": False, "artificial_style": False,
                       "non_dialogue": flag, "reason": "r"})


def test_filter_removes_exactly_the_flagged_rows_and_sets_the_unparsed_aside(tmp_path):
    from peer_rl.datajobs.filter import run_filter

    judge = Scripted(lambda r: _verdict(last_user(r)))
    report = run_filter(sample_root(), tmp_path / "out", _cfg("filter"), {"judge": judge})
    files = sorted((sample_root() / "grpo").glob("*.jsonl"))
    expected_kept, flagged, unparsed = {}, 0, 0
    for f in files:
        keep = []
        for line in _lines(f):
            text = _dialogue(json.loads(line))
            if "Friday" in text:
                unparsed += 1
            elif "friend" in text:
                flagged += 1
            else:
                keep.append(line)
        expected_kept[f.name] = keep
    for f in files:       # kept rows leave byte for byte, in order
        assert _lines(tmp_path / "out/grpo" / f.name) == expected_kept[f.name]
    s = report["summary"]
    total = sum(len(_lines(f)) for f in files)
    assert (s["judged"], s["removed"], s["unparsed"]) == (total, flagged, unparsed)
    assert s["rows_out"] == total - flagged - unparsed
    assert s["removed_per_criterion"] == {"semantic_incoherence": 0, "artificial_style": 0,
                                          "non_dialogue": flagged}
    assert abs(s["share_per_criterion"]["non_dialogue"] - flagged / total) < 1e-12
    assert s["per_source"]["peer-rl-sample"]["removed"] == flagged
    jobs = tmp_path / "out/_jobs/filter"
    assert len(_lines(jobs / "removed.jsonl")) == flagged
    aside = [json.loads(x) for x in _lines(jobs / "unparsed.jsonl")]
    assert len(aside) == unparsed and all("Friday" in _dialogue_norm(a["row"]) for a in aside)
    # the other subsets come along unchanged, images included; the output root is valid
    assert (tmp_path / "out/ser/en/text_train.jsonl").read_bytes() == \
        (sample_root() / "ser/en/text_train.jsonl").read_bytes()
    assert len(list((tmp_path / "out/grpo/images").iterdir())) == \
        len(list((sample_root() / "grpo/images").iterdir()))
    _all_valid(tmp_path / "out")
    assert "| non-dialogue content |" in (jobs / "report.md").read_text()


def _dialogue_norm(row: dict) -> str:
    return " ".join([t["content"] for t in row["history"]] + [row["solution"]])


class Dies(Scripted):
    """The endpoint goes away after `calls` batches, as a server that is killed."""
    def __init__(self, answer, calls):
        super().__init__(answer)
        self.calls = calls

    def chat(self, requests):
        if len(self.batches) >= self.calls:
            raise EndpointError("judge: unreachable")
        return super().chat(requests)


def test_a_filter_stopped_mid_run_and_rerun_judges_every_row_exactly_once(tmp_path):
    from peer_rl.datajobs.filter import run_filter

    cfg = _cfg("filter", "batch_cases=16", "limit=100")
    with pytest.raises(EndpointError):
        run_filter(sample_root(), tmp_path / "out", cfg, {"judge": Dies(lambda r: _verdict(
            last_user(r)), calls=3)})
    store = tmp_path / "out/_jobs/filter/cases.jsonl"
    assert len(_lines(store)) == 48 and not (tmp_path / "out/grpo").exists()
    again = Scripted(lambda r: _verdict(last_user(r)))
    report = run_filter(sample_root(), tmp_path / "out", cfg, {"judge": again})
    assert sum(len(b) for b in again.batches) == 52          # only the rows not on file
    ids = [json.loads(x)["id"] for x in _lines(store)]
    assert len(ids) == len(set(ids)) == 100
    assert report["summary"]["judged"] == 100 and report["summary"]["not_judged"] == 338
    # with a different judge setting the run is refused, not mixed
    from peer_rl.evaluation.store import RunMismatch
    with pytest.raises(RunMismatch, match="parties"):
        run_filter(sample_root(), tmp_path / "out", _cfg("filter", "limit=100",
                                                         "judge.temperature=0.5"),
                   {"judge": again})


def test_rounds_keeps_whole_rows_drawn_around_the_middle(tmp_path):
    from peer_rl.datajobs.rounds import run_rounds

    dialog = []
    for r in range(12):
        dialog += [{"speaker": "seeker", "content": f"seeker says {r}"},
                   {"speaker": "supporter", "content": f"supporter answers {r}",
                    "annotation": {"strategy": "Question"}}]
    src = tmp_path / "esconv.json"
    src.write_text(json.dumps([{"dialog": dialog}, {"dialog": dialog[:4]}, {"no": 1}]))
    rep = run_rounds(src, tmp_path / "a", rounds_per_dialogue=3, seed=1)["summary"]
    rows = [json.loads(x) for x in _lines(tmp_path / "a/grpo/esconv.jsonl")]
    assert rep["rows_out"] == len(rows) == 3 + 2        # 12 rounds -> 3 kept; 2 rounds -> both
    assert rep["skipped"] == {"no dialog list": 1}
    assert sum(rep["relative_position_histogram"]) == 5
    for row in rows:      # each row's solution answers its history's last seeker turn
        k = int(row["solution"].split()[-1])
        assert row["history"][-1]["content"] == f"seeker says {k}"
    _all_valid(tmp_path / "a")
    # a grpo root: rows leave as they came; the same seed gives the same rows
    rep = run_rounds(sample_root(), tmp_path / "b", rounds_per_dialogue=2, seed=0)["summary"]
    again = run_rounds(sample_root(), tmp_path / "c", rounds_per_dialogue=2, seed=0)["summary"]
    assert rep["files"] == again["files"]
    for f in rep["files"]:
        src_lines = set(_lines(sample_root() / f))
        out = _lines(tmp_path / "b" / f)
        assert out == _lines(tmp_path / "c" / f) and set(out) <= src_lines
    assert rep["rows_out"] <= 2 * rep["dialogues"] and rep["rows_out"] < 438
    _all_valid(tmp_path / "b")


CALM = "Speaks slowly and softly, pausing often, in long gentle sentences full of hedges."
BLUNT = "Fires off short blunt commands, no greetings, demands answers right now."


def _persona(r):
    text = last_user(r)
    calm = sum(map(ord, text)) % 2 == 0      # any fixed split of the seekers
    d = {"dominance": 1 if calm else 5, "influence": 2, "steadiness": 5 if calm else 1,
         "compliance": 3, "description": CALM if calm else BLUNT}
    return json.dumps(d)


@pytest.mark.e2e   # run_personas loads the real sentence encoder (personas.embedding_model)
def test_personas_cluster_the_two_planted_styles_apart(tmp_path):
    from peer_rl.datajobs.personas import run_personas

    writer = Scripted(_persona)
    rep = run_personas(sample_root(), tmp_path / "p", _cfg("personas"), {"writer": writer})
    s = rep["summary"]
    recs = [json.loads(x) for x in _lines(tmp_path / "p/personas.jsonl")]
    assert s["personas"] == len(recs) == s["seekers"] == len(writer.batches[0]) + sum(
        len(b) for b in writer.batches[1:])
    for lang in ("en", "zh"):
        mine = [r for r in recs if r["language"] == lang]
        by_style = {}
        for r in mine:
            by_style.setdefault(r["description"], set()).add(r["cluster"])
        # two styles -> k = 2 by silhouette, and each style in one cluster of its own
        assert s["clusters"][lang]["k"] == 2 and s["clusters"][lang]["how"] == "best silhouette"
        assert all(len(c) == 1 for c in by_style.values())
        assert by_style[CALM] != by_style[BLUNT]
    # every SER train row belongs to exactly one seeker
    train_rows = sum(len(_lines(f)) for f in (sample_root() / "ser").glob("*/*_train.jsonl"))
    assert sum(len(r["rows"]) for r in recs) == train_rows


def _upper(r):
    text = last_user(r)
    msgs = [m.split(". ", 1)[1] for m in text.split("in order:\n", 1)[1].split("\n\nAnswer")[0]
            .split("\n")] if "in order:\n" in text else \
        [m.split(". ", 1)[1] for m in text.split("（按顺序）：\n", 1)[1].split("\n\n用JSON")[0]
         .split("\n")]
    return json.dumps({"turns": [m.upper() + " !!" for m in msgs]})


@pytest.mark.e2e   # run_personas loads the real sentence encoder (personas.embedding_model)
def test_rewrite_appends_labelled_copies_with_the_seekers_words_rewritten(tmp_path):
    from peer_rl.datajobs.personas import run_personas
    from peer_rl.datajobs.rewrite import run_rewrite

    run_personas(sample_root(), tmp_path / "p", _cfg("personas"), {"writer": Scripted(_persona)})

    def judge(r):          # the filter removes every rewrite of the job-loss dialogue
        removed = "FOURTEEN YEARS" in last_user(r)
        return json.dumps({"semantic_incoherence": False, "artificial_style": removed,
                           "non_dialogue": False, "reason": "r"})

    writer = Scripted(lambda r: _persona(r) if "DISC" in last_user(r) else _upper(r))
    rep = run_rewrite(sample_root(), tmp_path / "p", tmp_path / "out", _cfg("rewrite"),
                      {"writer": writer, "judge": Scripted(judge)})
    s = rep["summary"]
    assert s["rewrites_unparsed"] == 0 and s["filter_removed"] == 1
    assert s["filter_removed_per_criterion"]["artificial_style"] == 1
    original_ids = set()
    for f in discover(sample_root()):
        original_ids |= {json.loads(x).get("id") for x in _lines(f.path)}
    added = 0
    for f in sorted((sample_root() / "ser").glob("*/*_train.jsonl")):
        src = _lines(f)
        out = _lines(tmp_path / "out" / f.relative_to(sample_root()))
        assert out[:len(src)] == src                    # the originals, untouched, first
        by_text = {}
        for line in src:
            row = json.loads(line)
            by_text[json.dumps(row["messages"][1:], ensure_ascii=False)] = row
        for line in out[len(src):]:
            aug = json.loads(line)
            added += 1
            assert aug["source"] == "augmented" and aug["id"] not in original_ids
            assert isinstance(aug["id"], int)
            first = aug["messages"][1]["content"]
            assert "FOURTEEN YEARS" not in first          # that dialogue's copy was removed
            assert "!!" in first
            # labels, steps and candidates unchanged: every message but the history block
            assert [m["content"] for m in aug["messages"][2:]] in [
                [m["content"] for m in json.loads(x)["messages"][2:]] for x in src]
    assert added == s["rows_added"] > 0
    assert s["movement"]["pairs"] > 0 and s["movement"]["cosine_distance_mean"] > 0
    # test splits are not augmented; the output root is valid
    assert (tmp_path / "out/ser/en/text_test.jsonl").read_bytes() == \
        (sample_root() / "ser/en/text_test.jsonl").read_bytes()
    _all_valid(tmp_path / "out")


def test_preference_pairs_follow_dominance_over_the_three_perspectives(tmp_path):
    from peer_rl.datajobs.preference import run_preference

    # candidate k of a turn replies "reply k"; the judge rates reply 0 highest everywhere,
    # reply 1 high for the client only, reply 2 lowest everywhere
    rating = {"reply 0": 8, "reply 1": 6, "reply 2": 2}

    def counselor(r):
        from peer_rl.evaluation.endpoints import Reply
        return Reply(texts=[json.dumps({"context": "c", "state": "s", "strategy": f"st{k}",
                                        "reply": f"reply {k}"}) for k in range(r.n)])

    def judge(r):
        text = last_user(r)
        reply = next(k for k in rating if f"reply:\n{k}\n" in text or f"回复：\n{k}\n" in text)
        dims = [d for d in ("emotional_impact", "non_lecturing_empathy", "therapeutic_alliance",
                            "strategic_coherence", "theoretical_application",
                            "strategy_client_fit", "problem_targeting") if f"- {d} (" in text]
        v = rating[reply] + (3 if reply == "reply 1" and "emotional_impact" in dims else 0)
        return json.dumps({**{d: v for d in dims}, "reason": "r"})

    parties = {"client": Scripted(lambda r: "I feel stuck."),
               "counselor": Scripted(counselor), "judge": Scripted(judge)}
    rep = run_preference(tmp_path / "out", _cfg("preference", "preference.stagewise=false",
                                                "preference.turns=2",
                                                "preference.candidates=3"), parties)
    s = rep["summary"]
    pairs = [json.loads(x) for split in ("train", "test")
             for x in _lines(tmp_path / f"out/preference/{split}.jsonl")]
    n_cards = len(json.loads((Path(__import__("peer_rl").__file__).parent /
                              "bundled/eval/esc_cards.json").read_text()))
    assert len(pairs) == 2 * n_cards == s["pairs"]["train"] + s["pairs"]["test"]
    for p in pairs:
        # reply 1 (client 9.0) is not dominated by reply 0 (client 8.0): reply 0 is chosen for
        # its total and rejects the one it dominates, reply 2
        assert (p["chosen"], p["rejected"]) == ("reply 0", "reply 2")
        assert p["scores"] == {"chosen": {"client": 8.0, "counselor": 8.0, "judge": 8.0},
                               "rejected": {"client": 2.0, "counselor": 2.0, "judge": 2.0}}
        assert p["history"][-1] == {"role": "seeker", "content": "I feel stuck."}
    second = [p for p in pairs if p["id"].endswith("-t2")]
    assert all(p["history"][1] == {"role": "supporter", "content": "reply 0"} for p in second)
    ex = [json.loads(x) for x in _lines(tmp_path / "out/exemplars/train.jsonl")]
    assert all(e["response"] == "reply 0" and e["strategy"] == "st0" for e in ex)
    assert all(e["dialogue"] == e["id"].rsplit("-t", 1)[0] for e in ex + pairs)
    # ESCRAG-R1's client: one short sentence per turn (ESC-Eval's seeker: one to three)
    client = parties["client"].batches[0][0].messages[0]["content"]
    assert "one short sentence per turn" in client and "one to three" not in client
    assert _all_valid(tmp_path / "out") == 4 * n_cards      # pairs + exemplars


def _tree(root: Path) -> dict:
    """Every data file of a root (job state aside), as bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.jsonl"))
            if "_jobs" not in p.parts}


@pytest.mark.e2e   # run_personas loads the real sentence encoder (personas.embedding_model)
def test_a_rewrite_stopped_mid_run_ends_as_an_uninterrupted_one(tmp_path):
    from peer_rl.datajobs.personas import run_personas
    from peer_rl.datajobs.rewrite import run_rewrite

    run_personas(sample_root(), tmp_path / "p", _cfg("personas"), {"writer": Scripted(_persona)})
    keep = json.dumps({"semantic_incoherence": False, "artificial_style": False,
                       "non_dialogue": False, "reason": "r"})
    cfg = _cfg("rewrite", "batch_cases=8")
    with pytest.raises(EndpointError):
        run_rewrite(sample_root(), tmp_path / "p", tmp_path / "cut", cfg,
                    {"writer": Scripted(_upper), "judge": Dies(lambda r: keep, calls=1)})
    assert len(_lines(tmp_path / "cut/_jobs/rewrite/cases.jsonl")) == 8
    assert not (tmp_path / "cut/ser").exists()
    writer = Scripted(_upper)
    run_rewrite(sample_root(), tmp_path / "p", tmp_path / "cut", cfg,
                {"writer": writer, "judge": Scripted(lambda r: keep)})
    assert sum(len(b) for b in writer.batches) == 28 - 8          # the rest only
    run_rewrite(sample_root(), tmp_path / "p", tmp_path / "whole", cfg,
                {"writer": Scripted(_upper), "judge": Scripted(lambda r: keep)})
    assert _tree(tmp_path / "cut") == _tree(tmp_path / "whole")


def test_a_preference_run_stopped_mid_run_ends_as_an_uninterrupted_one(tmp_path):
    from peer_rl.datajobs.preference import run_preference

    def counselor(r):
        from peer_rl.evaluation.endpoints import Reply
        return Reply(texts=[json.dumps({"context": "c", "state": "s", "strategy": "q",
                                        "reply": f"reply {k}"}) for k in range(r.n)])

    def judge(r):
        v = 9 if "reply:\nreply 0\n" in last_user(r) or "回复：\nreply 0\n" in last_user(r) else 3
        dims = [d for d in ("emotional_impact", "non_lecturing_empathy", "therapeutic_alliance",
                            "strategic_coherence", "theoretical_application",
                            "strategy_client_fit", "problem_targeting") if f"- {d} (" in last_user(r)]
        return json.dumps({**{d: v for d in dims}, "reason": "r"})

    def parties(counsel):
        return {"client": Scripted(lambda r: "It is hard."), "counselor": counsel,
                "judge": Scripted(judge)}

    cfg = _cfg("preference", "batch_cases=2", "preference.turns=1", "preference.candidates=2",
               "preference.stagewise=false")
    with pytest.raises(EndpointError):
        run_preference(tmp_path / "cut", cfg, parties(Dies(counselor, calls=1)))
    assert len(_lines(tmp_path / "cut/_jobs/preference/cases.jsonl")) == 2
    run_preference(tmp_path / "cut", cfg, parties(Scripted(counselor)))
    rep = run_preference(tmp_path / "whole", cfg, parties(Scripted(counselor)))
    assert _tree(tmp_path / "cut") == _tree(tmp_path / "whole")
    assert sum(rep["summary"]["pairs"].values()) == 4


def test_cold_start_asks_the_policy_prompt_and_keeps_only_well_formed_demonstrations(tmp_path):
    import re

    from peer_rl.datajobs.cold_start import run_cold_start
    from peer_rl.prompts.escrag import initial_messages

    asked = []

    def teacher(r):
        asked.append(r.messages)
        n = len(asked)
        if n % 4 == 0:
            return "I would say something kind."                   # no think block: set aside
        return f"<think> stage {n}: exploration </think>\n  Reply number {n}. "

    parties = {"teacher": Scripted(teacher)}
    # pass 1 alone here; both passes: tests/datajobs/test_cold_start_passes.py
    cfg = _cfg("cold_start", "cold_start.count=8", "cold_start.refined_share=0")
    rep = run_cold_start(sample_root(), tmp_path / "out", cfg, parties)
    s = rep["summary"]
    # the sample's preference train file: 304 pairs over 152 distinct contexts (two pairs a
    # turn); the test file's 134 are left out (the CCJ evaluation's contexts)
    assert (s["rows_in"], s["contexts"], s["asked"]) == (304, 152, 8)
    assert (s["demonstrations"], s["unparsed"]) == (6, 2)
    assert s["passed_over"] == {"same context as an earlier row": 152}
    assert s["left_out_splits"] == {"test": 134}
    demos = [json.loads(x) for x in _lines(tmp_path / "out/cold_start/train.jsonl")]
    assert len(demos) == 6 and _all_valid(tmp_path / "out") == 6
    histories = {}
    for f in ("train", "test"):
        for line in _lines(sample_root() / "preference" / f"{f}.jsonl"):
            row = json.loads(line)
            histories.setdefault(json.dumps(row["history"]), row)
    for d in demos:
        n = int(re.search(r"stage (\d+)", d["messages"][-1]["content"]).group(1))
        # the prompt is the policy's pass 1 for a sample context; the target normalised
        assert d["messages"][:-1] == asked[n - 1]
        assert any(asked[n - 1] == initial_messages(r["history"], r["language"])
                   for r in histories.values())
        assert d["messages"][-1]["content"] == (f"<think>stage {n}: exploration</think>\n"
                                                f"Reply number {n}.")
        assert d["pass"] == "initial"
    set_aside = [json.loads(x) for x in _lines(tmp_path / "out/_jobs/cold_start/unparsed.jsonl")]
    assert [u["answer"] for u in set_aside] == ["I would say something kind."] * 2
    # a rerun asks nothing again; a larger count extends the same draw
    run_cold_start(sample_root(), tmp_path / "out", cfg, parties)
    assert len(asked) == 8
    bigger = run_cold_start(sample_root(), tmp_path / "out",
                            _cfg("cold_start", "cold_start.count=10",
                                 "cold_start.refined_share=0"), parties)
    assert len(asked) == 10 and bigger["summary"]["asked"] == 10


def test_preference_selects_stage_by_stage_before_the_final_filtering(tmp_path):
    """ESCRAG-R1's construction: per stage the counsellor writes notes and the judge keeps one;
    each later stage and the replies see the notes kept; the CCJ scores pick the pair."""
    from peer_rl.datajobs.preference import run_preference

    def counselor(r):
        text = last_user(r)
        if '"note"' in text:
            stage = text.split("Now the ")[1].split(" stage")[0]
            return Reply(texts=[json.dumps({"note": f"{stage} note {k}"}) for k in range(r.n)])
        return Reply(texts=[json.dumps({"reply": f"reply {k}"}) for k in range(r.n)])

    def judge(r):
        text = last_user(r)
        if '"best"' in text:
            return json.dumps({"best": 3})                 # keep the third note of each stage
        value = 9 if "reply 0" in text else (1 if "reply 1" in text else 5)
        dims = [d for d in ("emotional_impact", "non_lecturing_empathy", "therapeutic_alliance",
                            "strategic_coherence", "theoretical_application",
                            "strategy_client_fit", "problem_targeting") if f"- {d} (" in text]
        return json.dumps({**{d: value for d in dims}, "reason": "r"})

    parties = {"client": Scripted(lambda r: "I feel stuck."),
               "counselor": Scripted(counselor), "judge": Scripted(judge)}
    rep = run_preference(tmp_path / "out", _cfg("preference", "preference.turns=1",
                                                "preference.candidates=2", "limit=2"), parties)
    s = rep["summary"]
    assert s["stage_picks"] == 3 * 2 and s["candidates"] == 2 * 2
    asked = [last_user(req) for batch in parties["counselor"].batches for req in batch]
    state = next(a for a in asked if "Now the state stage" in a)
    assert "- context: context note 2" in state and "strategy note" not in state
    reply = next(a for a in asked if '"reply"' in a)
    assert all(f"- {st}: {st} note 2" in reply for st in ("context", "state", "strategy"))
    pairs = [json.loads(x) for split in ("train", "test")
             for x in _lines(tmp_path / f"out/preference/{split}.jsonl")]
    assert len(pairs) == 2 and all((p["chosen"], p["rejected"]) == ("reply 0", "reply 1")
                                   for p in pairs)
    ex = [json.loads(x) for split in ("train", "test")
          for x in _lines(tmp_path / f"out/exemplars/{split}.jsonl")]
    assert all(e["strategy"] == "strategy note 2" for e in ex)
    # an unparseable pick stops that round: counted, nothing guessed
    parties["judge"] = Scripted(lambda r: "the second one" if '"best"' in last_user(r)
                                else judge(r))
    rep = run_preference(tmp_path / "out2", _cfg("preference", "preference.turns=1",
                                                 "preference.candidates=2", "limit=2"), parties)
    assert rep["summary"]["round_outcomes"]["no stage pick"] == 2
    assert rep["summary"]["pairs"] == {"train": 0, "test": 0}
