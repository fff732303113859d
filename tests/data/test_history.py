"""The history a GRPO row carries is decided once (peer_rl.data.history) and is the one in the
policy's prompt: by default the whole dialogue, with `data.max_history_turns` the last turns in
the prompt too. Expected histories come from the sample's files read with json, not from the
loader."""
import json

import datasets
import pytest

from peer_rl.cli import main
from peer_rl.config.schema import ConfigError, load_config
from peer_rl.data.bundled import sample_root
from peer_rl.data.history import cut, training_rows
from peer_rl.trainer.run import load_prompts

FILES = ("grpo/textual.jsonl", "grpo/visual.jsonl")


def raw_rows() -> dict[str, dict]:
    """The sample's grpo rows by the id the loader gives a row without one (`file:line`)."""
    out = {}
    for rel in FILES:
        for line, text in enumerate((sample_root() / rel).read_text().splitlines(), start=1):
            out[f"{rel}:{line}"] = json.loads(text)
    return out


def prompt_text(row: dict) -> str:
    return row["messages"][-1]["content"]


def test_by_default_a_row_keeps_its_whole_dialogue_and_its_own_prompt():
    raw = raw_rows()
    rows = load_prompts(load_config([f"data.train_files=[{','.join(FILES)}]"]))
    assert len(rows) == len(raw) == 304
    assert sum(len(r["history"]) > 8 for r in rows) == 80      # the rows a cut of 8 shortened
    for r in rows:
        whole = [{"role": t["role"], "content": t["content"]} for t in raw[r["id"]]["history"]]
        assert r["history"] == whole == r["dialogue_history"]
        assert r["messages"] == raw[r["id"]]["messages"]


@pytest.mark.parametrize("k", [1, 3])
def test_a_cap_cuts_the_policy_prompt_with_the_history(k):
    raw = raw_rows()
    rows = load_prompts(load_config([f"data.train_files=[{','.join(FILES)}]",
                                     f"data.max_history_turns={k}"]))
    cut_rows = 0
    for r in rows:
        whole = raw[r["id"]]["history"]
        assert [t["content"] for t in r["history"]] == [t["content"] for t in whole[-k:]]
        assert [t["content"] for t in r["dialogue_history"]] == [t["content"] for t in whole]
        text = prompt_text(r)
        assert all(t["content"] in text for t in r["history"])
        dropped = [t["content"] for t in whole[:-k]]
        assert not any(d in text for d in dropped if not any(d in t["content"]
                                                            for t in r["history"]))
        # only the history changed: the words around it are the file's
        before = prompt_text(raw[r["id"]])
        assert text.split("\n")[0] == before.split("\n")[0]
        assert text.split("\n")[-1] == before.split("\n")[-1]
        assert r["messages"][0] == raw[r["id"]]["messages"][0]
        cut_rows += len(whole) > k
    assert cut_rows == sum(len(x["history"]) > k for x in raw.values()) > 0


def test_a_cap_on_a_prompt_that_does_not_hold_its_history_is_refused():
    row = {"id": "r7", "language": "en", "history": [
        {"role": "seeker", "content": "a"}, {"role": "supporter", "content": "b"},
        {"role": "seeker", "content": "c"}],
        "messages": [{"role": "user", "content": "Answer the seeker."}]}
    assert training_rows([row], 0)[0]["messages"] == row["messages"]   # no cap: untouched
    with pytest.raises(ConfigError, match=r"data.max_history_turns=1: grpo row 'r7': its prompt "
                                          "does not hold its history"):
        training_rows([row], 1)
    with pytest.raises(ConfigError, match="data.max_history_turns=-1: expected 0"):
        cut(row["history"], -1)
    with pytest.raises(ConfigError, match="data.max_history_turns=-2: expected a value >= 0"):
        load_config(["data.max_history_turns=-2"])


@pytest.mark.parametrize("k", [0, 3])
def test_the_verl_export_sends_what_the_training_loop_uses(tmp_path, k):
    """`data to-verl --max-history-turns k` and `peer-rl train data.max_history_turns=k` give
    a row the same prompt and the same history (the plug-in's judge and RUR read the latter)."""
    loop = {r["id"]: r for r in load_prompts(load_config([f"data.max_history_turns={k}"]))}
    assert main(["data", "to-verl", str(sample_root()), "--out", str(tmp_path / "v"),
                 "--max-history-turns", str(k)]) == 0
    got = [r for split in ("train", "val")
           for r in datasets.Dataset.from_parquet(str(tmp_path / "v" / f"{split}.parquet"))]
    trained = [r for r in got if r["extra_info"]["id"] in loop]     # the test file's too
    assert len(trained) == 152
    for r in trained:
        row = loop[r["extra_info"]["id"]]
        assert r["extra_info"]["history"] == row["history"]
        assert r["prompt"] == row["messages"]
    assert max(len(r["extra_info"]["history"]) for r in trained) == (k or 11)
