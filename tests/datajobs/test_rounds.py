"""`data rounds` on grpo rows of dialogues that open with the same seeker turn, in English
("Hello") and Chinese ("你好"): each dialogue is sampled as itself. Expected counts are worked
out by hand; which dialogue a kept row came from is read off its `solution`, which names it."""
import json
from pathlib import Path

import pytest

from peer_rl.datajobs.rounds import run_rounds
from peer_rl.prompts.reasoning import policy_messages

OPENER = {"english": "Hello", "chinese": "你好"}
LANG = {"english": "en", "chinese": "zh"}


def dialogue(language: str, name: str, rounds: int, shared_reply: bool = False,
             with_id: bool = False) -> list[dict]:
    """The grpo rows of one dialogue, round r answering its r-th seeker turn; every turn but the
    opener (and, with `shared_reply`, the first supporter reply) names the dialogue. With
    `with_id` each row carries the dialogue's name as its `dialogue` id."""
    turns = [{"role": "seeker", "content": OPENER[language]}]
    for r in range(1, rounds + 1):
        first = shared_reply and r == 1
        turns.append({"role": "supporter", "content": "Hi, how are you today?" if first
                      else f"{name} reply {r}"})
        turns.append({"role": "seeker", "content": f"{name} says {r + 1}"})
    rows = []
    for r in range(1, rounds + 1):
        history = turns[:2 * r - 1]
        rows.append({"messages": policy_messages(history, LANG[language]), "history": history,
                     "solution": turns[2 * r - 1]["content"], "language": language,
                     "modality": "textual", "source": "ExTES",
                     **({"dialogue": name} if with_id else {})})
    return rows


def write_root(root: Path, rows: list[dict]) -> Path:
    (root / "grpo").mkdir(parents=True)
    (root / "grpo/textual.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return root


def interleaved(*dialogues):
    """Rows of several dialogues, round by round, as a shuffled pool might hold them."""
    return [d[r] for r in range(max(map(len, dialogues))) for d in dialogues if r < len(d)]


def kept_rows(out: Path) -> list[dict]:
    text = (out / "grpo/textual.jsonl").read_text(encoding="utf-8")
    return [json.loads(x) for x in text.splitlines()]


@pytest.mark.parametrize("ids", [False, True], ids=["by history", "by dialogue id"])
def test_two_dialogues_that_open_alike_are_sampled_as_two(tmp_path, ids):
    ds = [dialogue(lang, f"{lang}-{x}", 6, with_id=ids)
          for lang in ("english", "chinese") for x in "ab"]
    src = write_root(tmp_path / "in", interleaved(*ds))
    # k = 6 = N_r: every row of each 6-round dialogue is kept
    s = run_rounds(src, tmp_path / "all", rounds_per_dialogue=6)["summary"]
    assert s["dialogues"] == 4 and s["rows_out"] == 24 and s["ambiguous_rows"] == 0
    assert s["round_histogram"] == {r: 4 for r in range(1, 7)}
    # k = 3: three rows of each dialogue, positions r / N_r with N_r = 6
    s = run_rounds(src, tmp_path / "three", rounds_per_dialogue=3, seed=5)["summary"]
    rows = kept_rows(tmp_path / "three")
    assert s["dialogues"] == 4 and s["rows_out"] == len(rows) == 12
    by_dialogue = {}
    for row in rows:
        name = row["solution"].split(" reply")[0]
        by_dialogue.setdefault(name, []).append(int(row["solution"].split()[-1]))
    assert sorted(by_dialogue) == ["chinese-a", "chinese-b", "english-a", "english-b"]
    assert all(len(rs) == 3 for rs in by_dialogue.values())
    positions = [(r - 0.5) / 6 for rs in by_dialogue.values() for r in rs]
    assert s["mean_relative_position"] == pytest.approx(sum(positions) / 12)


def test_rows_of_an_opening_two_dialogues_share_are_their_own_counted_group(tmp_path):
    # both dialogues of a language open alike and get the same first reply: their round-1
    # rows cannot be told apart (history and solution are the same), so per language they are
    # one group of two rows, marked; rounds 2-3 of each dialogue are that dialogue's
    ds = [dialogue(lang, f"{lang}-{x}", 3, shared_reply=True)
          for lang in ("english", "chinese") for x in "ab"]
    src = write_root(tmp_path / "in", interleaved(*ds))
    s = run_rounds(src, tmp_path / "all", rounds_per_dialogue=3)["summary"]
    assert s["dialogues"] == 2 * 3 and s["ambiguous_rows"] == 2 * 2 and s["rows_out"] == 12
    s = run_rounds(src, tmp_path / "one", rounds_per_dialogue=1, seed=3)["summary"]
    assert s["dialogues"] == 6 and s["rows_out"] == 6
    rows = kept_rows(tmp_path / "one")
    # one row per group: per language one of dialogue a's rounds 2-3, one of b's, one round-1
    for lang in ("english", "chinese"):
        mine = [r for r in rows if r["language"] == lang]
        assert sorted(r["solution"].split(" reply")[0] if len(r["history"]) > 1 else "round 1"
                      for r in mine) == sorted([f"{lang}-a", f"{lang}-b", "round 1"])
