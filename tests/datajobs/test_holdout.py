"""`peer-rl data holdout`: the GRPO prompts split by dialogue into a copy of the root."""
import json
import shutil

import pytest

from peer_rl.cli import main
from peer_rl.data.bundled import copy_sample


@pytest.fixture
def root(tmp_path):
    """The sample root without its held-out files (as PEER's card ships the GRPO pool)."""
    r = tmp_path / "root"
    copy_sample(r)
    for name in ("textual_test.jsonl", "visual_test.jsonl"):
        (r / "grpo" / name).unlink()
    return r


def _lines(path):
    return path.read_bytes().splitlines()


def _turns(line: bytes) -> tuple:
    row = json.loads(line)
    return (row["language"], row["source"]), tuple(t["content"] for t in row["history"])


def _same_dialogue(a: bytes, b: bytes) -> bool:
    """One row's history continues the other's (same language and source): rounds of one
    conversation, worked out here from the histories themselves."""
    (sa, ta), (sb, tb) = _turns(a), _turns(b)
    short, long_ = sorted((ta, tb), key=len)
    return sa == sb and long_[:len(short)] == short


def test_whole_dialogues_are_held_and_every_row_lands_once_as_read(root, tmp_path, capsys):
    out = tmp_path / "split"
    assert main(["data", "holdout", str(root), "--out", str(out), "--rows", "20"]) == 0
    for name in ("textual", "visual"):
        original = _lines(root / "grpo" / f"{name}.jsonl")
        kept, held = _lines(out / "grpo" / f"{name}.jsonl"), _lines(out / "grpo" / f"{name}_test.jsonl")
        assert len(held) >= 20 and len(kept) + len(held) == len(original)
        # byte for byte, each side in the input's order
        assert sorted(kept + held) == sorted(original)
        assert kept == [x for x in original if x in set(kept)]
        assert held == [x for x in original if x in set(held)]
        # no conversation on both sides
        assert not any(_same_dialogue(h, k) for h in held for k in kept)
    # the other subsets and the frames come along unchanged; the input is untouched
    for rel in ("ser/en/text_train.jsonl", "safety/test.jsonl", "grpo/images/face_angry_1.png"):
        assert (out / rel).read_bytes() == (root / rel).read_bytes(), rel
    assert not (root / "grpo" / "textual_test.jsonl").exists()
    printed = capsys.readouterr().out
    assert "grpo/textual.jsonl: " in printed and "held out in grpo/textual_test.jsonl" in printed


def test_the_same_seed_gives_the_same_split_and_another_seed_another(root, tmp_path):
    split = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        assert main(["data", "holdout", str(root), "--out", str(tmp_path / name),
                     "--rows", "20", "--seed", str(seed)]) == 0
        split[name] = (tmp_path / name / "grpo" / "textual_test.jsonl").read_bytes()
    assert split["a"] == split["b"] and split["a"] != split["c"]


def test_a_file_with_its_held_out_file_is_copied_as_it_is(tmp_path):
    root = tmp_path / "root"
    copy_sample(root)                              # textual_test.jsonl already there
    out = tmp_path / "split"
    assert main(["data", "holdout", str(root), "--out", str(out)]) == 0
    for name in ("textual.jsonl", "textual_test.jsonl"):
        assert (out / "grpo" / name).read_bytes() == (root / "grpo" / name).read_bytes()


def test_no_rows_to_hold_is_refused_in_one_line(root, tmp_path, capsys):
    assert main(["data", "holdout", str(root), "--out", str(tmp_path / "o"), "--rows", "0"]) == 2
    assert capsys.readouterr().err == "error: --rows=0: expected >= 1 (rows held out per file)\n"
    shutil.rmtree(root / "grpo")
    assert main(["data", "holdout", str(root), "--out", str(tmp_path / "p")]) == 2
    assert "no files of grpo" in capsys.readouterr().err
