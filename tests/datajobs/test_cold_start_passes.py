"""`data cold-start` teaches both of ESCRAG-R1's policy prompts: pass 2 (the one the reward scores
and GRPO trains) is asked with the prompt the trainer builds for it, from the teacher's own pass-1
reply and the exemplars the index returns for it. The teacher is scripted; the index is real
(faiss), with an encoder whose vectors the test sets so that the order of the hits is known."""
import json

import numpy as np
import pytest

from evaluation.scripted import Scripted, last_user
from peer_rl.datajobs.cold_start import run_cold_start
from peer_rl.datajobs.config import load_job_config
from peer_rl.prompts.escrag import initial_messages, refined_messages

URL = "http://127.0.0.1:9/v1"
SEEKER = {f"d{i}": text for i, text in enumerate(
    ["I lost my job last week.", "My best friend moved abroad.", "I keep failing my exams.",
     "My parents argue every night."], start=1)}
# exemplars: three of other dialogues (known scores for every query: 0.707, 0.636, 0.566 after
# normalisation) and, per context, one of its own dialogue that would score 1.0 for it
EXEMPLARS = {"A": "It makes sense that this shook you; you had built so much there.",
             "B": "Missing someone who was part of every day is a real loss.",
             "C": "When effort does not show in results, it is easy to doubt yourself."}
DRAFT = "That sounds hard. What has been hardest?"
FINAL = "It has been a heavy week for you. What part of it stays with you most?"


def _unit(*pairs):
    v = np.zeros(8, dtype=np.float32)
    for i, x in pairs:
        v[i] = x
    return v / np.linalg.norm(v)


class SetEncoder:
    """Exemplar A along e0, B and C leaning towards e7; a context's query (its seeker turn and
    the draft) is (e0 + e_i) / sqrt(2), and its own dialogue's exemplar the same vector."""
    dim = 8

    def _vec(self, text):
        for key, vec in ((EXEMPLARS["A"], _unit((0, 1))),
                         (EXEMPLARS["B"], _unit((0, 0.9), (7, 0.19 ** 0.5))),
                         (EXEMPLARS["C"], _unit((0, 0.8), (7, 0.6)))):
            if key in text:
                return vec
        for i, (d, seeker) in enumerate(SEEKER.items(), start=1):
            if seeker in text or f"own reply of {d}" in text:
                return _unit((0, 1), (i, 1))
        raise AssertionError(f"unexpected text to embed: {text!r}")

    def encode(self, texts):
        return np.stack([self._vec(t) for t in texts])


def _row(d, **extra):
    return {"id": f"{d}-x", "language": "en", "dialogue": d,
            "history": [{"role": "seeker", "content": SEEKER[d]}], **extra}


@pytest.fixture
def root(tmp_path, monkeypatch):
    import peer_rl.models.encoders

    monkeypatch.setattr(peer_rl.models.encoders, "load_embedding_model", lambda *a, **k: SetEncoder())
    r = tmp_path / "root"
    (r / "preference").mkdir(parents=True)
    (r / "exemplars").mkdir()
    pairs = [_row(d, chosen="Good reply.", rejected="Bad reply.") for d in SEEKER]
    (r / "preference" / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in pairs))
    ex = [{"id": f"x-{k}", "language": "en", "dialogue": f"other-{k}", "response": text,
           "history": [{"role": "seeker", "content": "Some other moment."}]}
          for k, text in EXEMPLARS.items()]
    ex += [_row(d, response=f"The own reply of {d}.") | {"id": f"own-{d}"} for d in SEEKER]
    (r / "exemplars" / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ex))
    return r


def _teacher(asked):
    def answer(request):
        asked.append(request.messages)
        if "Your initial response:" in last_user(request):
            return f"<think>Stage: exploration. The draft can be warmer.</think>\n{FINAL}"
        return f"<think>Stage: exploration.</think>\n{DRAFT}"
    return answer


def test_the_pass_of_each_drawn_context_by_hand():
    from peer_rl.datajobs.cold_start import passes

    # share 1/2: every second context; the first N hold floor(N / 2)
    assert passes(5, 0.5) == ["initial", "refined", "initial", "refined", "initial"]
    # share 0.3: the 4th (floor(4 x 0.3) = 1 > floor(3 x 0.3) = 0), the 7th and the 10th
    assert [i + 1 for i, p in enumerate(passes(10, 0.3)) if p == "refined"] == [4, 7, 10]
    assert passes(3, 0.0) == ["initial"] * 3 and passes(3, 1.0) == ["refined"] * 3
    # a larger count extends the draw without changing the earlier contexts' passes
    assert passes(20, 0.3)[:10] == passes(10, 0.3)


def test_cold_start_writes_both_passes_in_the_set_share(root, tmp_path):
    asked = []
    cfg = load_job_config("cold_start", [f"teacher.url={URL}", "cold_start.count=4"])
    rep = run_cold_start(root, tmp_path / "out", cfg, {"teacher": Scripted(_teacher(asked))})
    demos = [json.loads(x) for x in (tmp_path / "out/cold_start/train.jsonl").read_text()
             .splitlines()]
    # 4 contexts at share 0.5: the 2nd and 4th of the draw teach pass 2; each of those asks the
    # teacher twice (its draft, then pass 2): 2 + 2 x 2 = 6 requests
    assert [d["pass"] for d in demos] == ["initial", "refined", "initial", "refined"]
    assert len(asked) == 6
    s = rep["summary"]
    assert (s["refined_share"], cfg.cold_start.k) == (0.5, 3)              # the defaults
    assert s["passes"] == {"initial": {"asked": 2, "demonstrations": 2, "unparsed": 0},
                           "refined": {"asked": 2, "demonstrations": 2, "unparsed": 0}}
    rows = [json.loads(x) for x in (root / "preference/train.jsonl").read_text().splitlines()]
    for d in demos:
        row = rows[int(d["context"].rsplit(":", 1)[1]) - 1]
        history, dialogue = row["history"], row["dialogue"]
        if d["pass"] == "initial":
            assert d["messages"][:-1] == initial_messages(history, "en")
            assert d["messages"][-1]["content"] == f"<think>Stage: exploration.</think>\n{DRAFT}"
            continue
        # pass 2: the trainer's builder (peer_rl.methods.escrag_r1 calls refined_messages) for the
        # same dialogue, initial reply and exemplars; the own dialogue's exemplar (score 1.0) is
        # passed over and the other three come in score order A (0.707), B (0.636), C (0.566)
        expected = refined_messages(history, "en", DRAFT,
                                  [EXEMPLARS["A"], EXEMPLARS["B"], EXEMPLARS["C"]])
        assert d["messages"][:-1] == expected
        assert d["messages"][1]["content"] == (
            f"The conversation so far:\nSeeker: {SEEKER[dialogue]}\n\n"
            "Your initial response:\nThat sounds hard. What has been hardest?\n\n"
            "Guidelines from an external library (replies counselors preferred in similar "
            "moments):\n"
            "1. It makes sense that this shook you; you had built so much there.\n"
            "2. Missing someone who was part of every day is a real loss.\n"
            "3. When effort does not show in results, it is easy to doubt yourself.\n\n"
            "Use what helps from the guidelines, keep your own voice and the client's "
            "specifics. Think in <think></think>, then write your final response.")
        assert d["messages"][-1]["content"] == (
            f"<think>Stage: exploration. The draft can be warmer.</think>\n{FINAL}")
        assert expected in asked                                # what the teacher was asked
    # the index was built from the root's train exemplars (3 + 4 rows) in the job's directory
    info = json.loads((tmp_path / "out/_jobs/cold_start/index/index.json").read_text())
    assert info["count"] == 7 and info["splits"] == {"train": 7}


def test_a_share_of_zero_teaches_pass_1_only_and_needs_no_index(root, tmp_path):
    asked = []
    cfg = load_job_config("cold_start", [f"teacher.url={URL}", "cold_start.count=4",
                                         "cold_start.refined_share=0"])
    rep = run_cold_start(root, tmp_path / "out", cfg, {"teacher": Scripted(_teacher(asked))})
    assert rep["summary"]["passes"]["refined"]["asked"] == 0 and len(asked) == 4
    assert not (tmp_path / "out/_jobs/cold_start/index").exists()
    with pytest.raises(Exception, match=r"cold_start.refined_share=1.5: expected a share in"):
        load_job_config("cold_start", [f"teacher.url={URL}", "cold_start.refined_share=1.5"])


def test_contexts_come_from_the_train_split_unless_told(root, tmp_path):
    """The test contexts are the ones the CCJ evaluation asks about: a demonstration written on
    one would teach the policy an answer to its own test question."""
    test_rows = [{"id": "t-1", "language": "en", "dialogue": "t1", "chosen": "Good.",
                  "rejected": "Bad.", "history": [{"role": "seeker", "content": SEEKER["d1"]
                                                   + " And my rent is due."}]}]
    (root / "preference" / "test.jsonl").write_text(json.dumps(test_rows[0]) + "\n")
    asked = []
    cfg = load_job_config("cold_start", [f"teacher.url={URL}", "cold_start.count=10",
                                         "cold_start.refined_share=0"])
    s = run_cold_start(root, tmp_path / "a", cfg, {"teacher": Scripted(_teacher(asked))})[
        "summary"]
    # 4 train contexts drawn of 10 asked for; the test file's one row left out
    assert (s["contexts"], s["asked"], s["short_of_count"]) == (4, 4, 6)
    assert s["left_out_splits"] == {"test": 1}
    assert all(d["context"].startswith("preference/train.jsonl:") for d in map(
        json.loads, (tmp_path / "a/cold_start/train.jsonl").read_text().splitlines()))
    cfg = load_job_config("cold_start", [f"teacher.url={URL}", "cold_start.count=10",
                                         "cold_start.refined_share=0",
                                         "cold_start.splits=[train,test]"])
    s = run_cold_start(root, tmp_path / "b", cfg, {"teacher": Scripted(_teacher(asked))})[
        "summary"]
    assert (s["contexts"], s["asked"]) == (5, 5) and s["left_out_splits"] == {}


def test_the_old_key_final_share_stops_at_start_up_naming_the_new_one(root, tmp_path, capsys):
    """Pass 2 is `refined` (one word per idea): `cold_start.final_share`, on the command line
    or in a recipe, fails in one line before any work, not as an unknown key."""
    from peer_rl.cli import main

    want = ("cold_start.final_share: renamed cold_start.refined_share; write "
            "cold_start.refined_share=0.25 instead")
    recipe = tmp_path / "old.yaml"
    recipe.write_text("base: data\ncold_start:\n  final_share: 0.25\n")
    for over, where in ((["cold_start.final_share=0.25"], ""),
                        ([f"recipe={recipe}"], f"recipe {str(recipe)!r}: ")):
        assert main(["data", "cold-start", str(root), "--out", str(tmp_path / "out"),
                     f"teacher.url={URL}", *over]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"error: {where}{want}"
        assert not (tmp_path / "out").exists()


def test_a_run_begun_under_the_old_names_continues(root, tmp_path):
    """A run written before the rename (run.json's `final_share`, cases.jsonl's
    `"pass": "final"`) is extended by a larger count: its cases are not asked again, and its
    pass-2 demonstrations keep the pass-2 prompt, written as `refined`."""
    asked = []
    parties = {"teacher": Scripted(_teacher(asked))}
    out, jobs = tmp_path / "out", tmp_path / "out/_jobs/cold_start"
    run_cold_start(root, out, load_job_config("cold_start", [f"teacher.url={URL}",
                                                              "cold_start.count=2"]), parties)
    assert len(asked) == 3                          # context 1 pass 1; context 2 draft + pass 2
    run = json.loads((jobs / "run.json").read_text())       # as the old code wrote them
    run["settings"] = {("final_share" if k == "refined_share" else k): v
                       for k, v in run["settings"].items()}
    (jobs / "run.json").write_text(json.dumps(run))
    cases = [json.loads(x) for x in (jobs / "cases.jsonl").read_text().splitlines()]
    assert [c["pass"] for c in cases] == ["initial", "refined"]
    (jobs / "cases.jsonl").write_text("".join(json.dumps(c | {"pass": c["pass"].replace(
        "refined", "final")}) + "\n" for c in cases))
    rep = run_cold_start(root, out, load_job_config("cold_start", [f"teacher.url={URL}",
                                                                    "cold_start.count=4"]),
                         parties)
    assert len(asked) == 3 + 3                      # contexts 3 and 4 only
    demos = [json.loads(x) for x in (out / "cold_start/train.jsonl").read_text().splitlines()]
    assert [d["pass"] for d in demos] == ["initial", "refined", "initial", "refined"]
    assert all(("Your initial response:" in d["messages"][1]["content"]) == (d["pass"] ==
                                                                            "refined")
               for d in demos)
    assert rep["summary"]["passes"]["refined"]["demonstrations"] == 2
