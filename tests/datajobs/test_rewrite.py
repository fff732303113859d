"""`data rewrite` on SER dialogues that open with the same seeker turn, in English and Chinese
(tests/datajobs/ser_dialogues.py): every copy carries its own dialogue's rewritten seeker
messages. The writer's rewrite of a message is the message in capitals plus " !!", so the
expected copy of each row is written down from that row alone."""
import json

import pytest

from evaluation.scripted import Scripted, last_user
from peer_rl.datajobs.config import load_job_config
from peer_rl.datajobs.personas import PERSONAS_FILE, seekers_of
from peer_rl.datajobs.rewrite import run_rewrite
from peer_rl.prompts.judge import JudgeTemplate

from datajobs.ser_dialogues import ROWS, STEP1, history, write_root

KEEP = json.dumps({"semantic_incoherence": False, "artificial_style": False,
                   "non_dialogue": False, "reason": "r"})


def _capitals(r):
    """The writer: each listed seeker message in capitals, marked."""
    text = last_user(r)
    head = "in order:\n" if "in order:\n" in text else "（按顺序）：\n"
    block = text.split(head, 1)[1].split("\n\n", 1)[0]
    return json.dumps({"turns": [m.split(". ", 1)[1].upper() + " !!"
                                 for m in block.splitlines()]})


def _rewritten(turns: list[dict]) -> list[dict]:
    return [{**t, "content": t["content"].upper() + " !!"} if t["role"] == "seeker" else t
            for t in turns]


@pytest.mark.e2e   # run_rewrite loads the real sentence encoder (rewrite.embedding_model)
def test_each_copy_gets_its_own_dialogues_rewrite(tmp_path):
    root = write_root(tmp_path / "in")
    cfg = load_job_config("rewrite", [f"{r}.url=http://127.0.0.1:9/v1"
                                      for r in ("writer", "judge")])
    seekers, _, _ = seekers_of(root, cfg)
    personas = tmp_path / "personas"
    personas.mkdir()
    (personas / PERSONAS_FILE).write_text("".join(json.dumps(
        {"seeker": sk.id, "language": sk.language, "cluster": f"{sk.language}-0",
         "description": "Writes in capitals."}) + "\n" for sk in seekers), encoding="utf-8")
    s = run_rewrite(root, personas, tmp_path / "out", cfg,
                    {"writer": Scripted(_capitals), "judge": Scripted(lambda r: KEEP)})["summary"]
    # per language: pet, job and the shared opener; every one of the 7 rows gets one copy
    assert s["seekers"] == 6 and s["ambiguous_rows"] == 4
    assert s["filter_kept"] == 6 and s["rows_added"] == 14
    template, copies = JudgeTemplate(), {}
    for lang in ("en", "zh"):
        out = (tmp_path / "out/ser" / lang / "text_train.jsonl").read_text(
            encoding="utf-8").splitlines()
        assert len(out) == 2 * len(ROWS)
        for copy in map(json.loads, out[len(ROWS):]):
            step1 = copy["messages"][1]["content"]
            line = int(step1.rsplit("(line ", 1)[1].split(")")[0])
            copies[lang, line] = step1
            name, rnd = ROWS[line - 1]
            want = template.step_turn(1, f"{STEP1[name]} (line {line})",
                                      _rewritten(history(lang, name, rnd)), lang)
            assert step1 == want["content"], (lang, line)
    assert len(copies) == 2 * len(ROWS)                 # one copy of each row
    # the row of the issue written out: the job dialogue's round 2 keeps its own history
    assert copies["en", 4].startswith(
        "Dialogue history:\nSeeker: HELLO !!\nSupporter: Hello! How are you doing?\n"
        "Seeker: I GOT LAID OFF A WEEK AGO. !!\n\nStep 1 of the supporter's reasoning")
    assert copies["zh", 4].startswith(
        "对话历史：\n求助者: 你好 !!\n支持者: 你好呀，最近怎么样？\n求助者: 我上周被裁员了。 !!\n\n")
