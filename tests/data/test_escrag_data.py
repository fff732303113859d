"""ESC-Preference pairs and the exemplar corpus: validated like the PEER subsets."""
import json

from peer_rl.data.layout import discover
from peer_rl.data.bundled import sample_root, targets
from peer_rl.data.validate import check_file


def _check(tmp_path, subset, rows):
    d = tmp_path / subset
    d.mkdir()
    (d / "x.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    [df] = [f for f in discover(tmp_path) if f.subset == subset]
    return check_file(df)


HIST = [{"speaker": "seeker", "content": "I failed again."},
        {"speaker": "supporter", "content": "That's hard."},
        {"speaker": "seeker", "content": "Yeah."}]


def test_pairs_load_with_any_history_spelling_and_optional_scores(tmp_path):
    rep = _check(tmp_path, "preference", [
        {"id": 1, "language": "english", "history": HIST, "chosen": "a", "rejected": "b",
         "scores": {"chosen": {"client": 8.5, "counselor": 9, "judge": 8},
                    "rejected": {"client": 3, "counselor": 4, "judge": 2}}},
        {"id": "p2", "language": "zh", "history": ["我又没考上。"], "chosen": "c", "rejected": "d"}])
    assert not rep.problems
    assert rep.rows[0]["id"] == "1" and rep.rows[0]["language"] == "en"
    assert rep.rows[0]["history"][-1] == {"role": "seeker", "content": "Yeah."}
    assert rep.rows[0]["scores"]["chosen"]["counselor"] == 9


def test_bad_pairs_name_line_and_field(tmp_path):
    path = tmp_path / "preference" / "x.jsonl"
    rep = _check(tmp_path, "preference", [
        {"id": 1, "language": "en", "history": HIST, "chosen": "same", "rejected": "same"},
        {"id": 2, "language": "en", "history": HIST[:2], "chosen": "a", "rejected": "b"},
        {"id": 3, "language": "en", "history": HIST, "chosen": "a", "rejected": "b",
         "scores": {"chosen": {"client": 11}}},
        {"id": 4, "language": "en", "history": HIST, "chosen": "a"}])
    msgs = [str(p) for p in rep.problems]
    assert f"{path}:1: rejected: expected a reply different from chosen" in msgs
    assert any(m.startswith(f"{path}:2: history: expected the last turn to be the seeker's")
               for m in msgs)
    assert any(m.startswith(f"{path}:3: scores: expected an object") for m in msgs)
    assert any(m.startswith(f"{path}:4: rejected: missing") for m in msgs)
    assert rep.n_invalid == 4


def test_exemplars_need_a_response_and_an_id(tmp_path):
    rep = _check(tmp_path, "exemplars", [
        {"id": "e1", "language": "en", "history": HIST, "response": "r", "strategy": "Question"},
        {"language": "en", "history": HIST, "response": "r"},
        {"id": "e3", "language": "en", "history": HIST, "response": ""}])
    assert rep.n_invalid == 2 and rep.rows[0]["strategy"] == "Question"


def test_the_sample_pairs_and_exemplars_keep_test_dialogues_out_of_the_index():
    root = sample_root()
    [ex] = [f for f in discover(root) if f.subset == "exemplars"]
    pref = {f.path.stem: check_file(f).rows for f in discover(root) if f.subset == "preference"}
    ex_rows = check_file(ex).rows
    test_dialogues = {r["id"].rsplit("-t", 1)[0] for r in pref["test"]}
    assert test_dialogues and not any(r["id"].rsplit("-t", 1)[0] in test_dialogues for r in ex_rows)
    assert {r["language"] for r in ex_rows} == {"en", "zh"}
    assert all(r["chosen"] != r["rejected"] for rows in pref.values() for r in rows)


def test_no_sample_exemplar_is_a_grpo_reference_reply():
    root = sample_root()
    [ex] = [f for f in discover(root) if f.subset == "exemplars"]
    replies = {r["response"] for r in check_file(ex).rows}
    grpo = [r for f in discover(root) if f.subset == "grpo" for r in check_file(f).rows]
    assert len(grpo) > 300 and len(replies) == 152
    assert not replies & {r["solution"] for r in grpo}
    assert all(r.get("dialogue") for r in check_file(ex).rows)


def test_eval_pairs_names_a_bad_pair_before_starting_an_engine(tmp_path, capsys):
    from peer_rl.cli import main

    (tmp_path / "data" / "preference").mkdir(parents=True)
    (tmp_path / "data" / "preference" / "test.jsonl").write_text(
        '{"id": 1, "language": "en", "history": ["hi"], "chosen": "a"}\n')
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")     # a whole model directory, by its files
    assert main(["eval", "pairs", "--model", str(model), "--data", str(tmp_path / "data"),
                 "--out", str(tmp_path / "r.json")]) == 2
    assert "test.jsonl:1: rejected: missing" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def _demo(content, **extra):
    return {"id": "c1", "language": "en", **extra,
            "messages": [{"role": "system", "content": "You are a therapist."},
                         {"role": "user", "content": "The conversation so far: ..."},
                         {"role": "assistant", "content": content}]}


def test_cold_start_demonstrations_need_one_think_block_then_a_reply(tmp_path):
    path = tmp_path / "cold_start" / "x.jsonl"
    rep = _check(tmp_path, "cold_start", [
        _demo("<think>Stage: exploration.</think>\nThat sounds hard.", **{"pass": "refined"}),
        _demo("That sounds hard."),                                  # no reasoning
        _demo("<think>Stage: exploration.</think>"),                 # no reply
        _demo("<think>a</think><think>b</think> reply"),             # two think blocks
        _demo("<think>a</think> reply", **{"pass": "third"}),
        {"id": "c6", "language": "en", "messages": [{"role": "user", "content": "hi"}]}])
    msgs = [str(p) for p in rep.problems]
    want = "messages[-1].content: expected <think>reasoning</think> then a non-empty reply"
    assert [m.startswith(f"{path}:{line}: {want}") for line in (2, 3, 4)
            for m in msgs].count(True) == 3
    assert any(m.startswith(f"{path}:5: pass: expected one of initial, refined, found 'third'")
               for m in msgs)
    assert any(m.startswith(f"{path}:6: messages: expected a chat ending with a user turn then "
                            "the assistant target") for m in msgs)
    assert rep.n_invalid == 5 and rep.rows[0]["pass"] == "refined"


def test_a_file_written_with_the_old_pass_final_reads_as_pass_2(tmp_path, capsys):
    """Pass 2 was `"pass": "final"` before it was `refined` (one word per idea): files users
    wrote then still check, and read as pass 2 under today's name wherever rows are read."""
    from peer_rl.cli import main
    from peer_rl.data.escrag import canonical_pass

    rep = _check(tmp_path, "cold_start", [
        _demo("<think>Stage: exploration.</think>\nThat sounds hard.", **{"pass": "final"}),
        _demo("<think>Stage: exploration.</think>\nThat sounds hard.",
              **{"pass": "initial"}) | {"id": "c2"}])
    assert not rep.problems
    assert [r["pass"] for r in rep.rows] == ["refined", "initial"]
    assert [canonical_pass(v) for v in ("final", "refined", "initial", "Final", None)] == \
        ["refined", "refined", "initial", None, None]
    assert main(["data", "stats", str(tmp_path), "--json"]) == 0
    [stats] = json.loads(capsys.readouterr().out)
    assert stats["pass"] == {"refined": 1, "initial": 1}


def test_the_sample_cold_start_covers_both_passes_of_every_train_turn():
    from peer_rl.prompts.escrag import parse_reasoned

    root = sample_root()
    [df] = [f for f in discover(root) if f.subset == "cold_start"]
    rep = check_file(df)
    assert not rep.problems
    train_turns = {t["id"] for lang in ("en", "zh") for t in targets(lang) if t["split"] == "train"}
    by_pass = {p: {r["id"].rsplit("-", 1)[0] for r in rep.rows if r["pass"] == p}
               for p in ("initial", "refined")}
    assert by_pass["initial"] == by_pass["refined"] == train_turns
    refined = next(r for r in rep.rows if r["pass"] == "refined")
    # the pass-2 prompt carries an initial reply and numbered guidelines; the target's reply is
    # the turn's reference reply. The sample keeps pass 2's old spelling (escrag.SAMPLE_PASS_2:
    # `"pass": "final"`, ids ending -final), read as "refined"
    tg = next(t for t in targets("en") if f"{t['id']}-final" == refined["id"])
    assert f"Your initial response:\n{tg['poor']}" in refined["messages"][1]["content"]
    assert f"1. {tg['alt_good']}" in refined["messages"][1]["content"]
    assert parse_reasoned(refined["messages"][-1]["content"]).reply == tg["text"]
