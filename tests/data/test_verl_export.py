"""`peer-rl data to-verl`: grpo rows as the parquet verl's RL dataset reads, every row accounted
for (written to train, val or test, or skipped and counted); the held-out *_test rows never in
train or val; no split of an earlier run left beside a new one."""
import json

import datasets
import pytest

from peer_rl.cli import main
from peer_rl.data.bundled import copy_sample
from peer_rl.data.verl_export import export_verl

HISTORY = [{"role": "seeker", "content": "I can't sleep."}]


def row(i: int, images=()):
    return {"id": f"r{i}", "language": "en", "source": "hand", "history": HISTORY,
            "solution": f"reference {i}", "images": list(images),
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": f"u{i}"}]}


def read(path) -> list[dict]:
    return list(datasets.Dataset.from_parquet(str(path)))


def test_rows_carry_the_prompt_reference_and_history(tmp_path):
    rows = [row(0), row(1), row(2), row(3, images=["f.jpg"])]
    rep = export_verl(rows, tmp_path, val_fraction=0.34, seed=0)
    assert rep.written == {"val": 1, "train": 2}          # round(0.34 x 3 text rows) = 1
    assert sum(rep.skipped.values()) == 1 and "visual" in next(iter(rep.skipped))
    got = read(tmp_path / "train.parquet") + read(tmp_path / "val.parquet")
    assert sorted(r["extra_info"]["id"] for r in got) == ["r0", "r1", "r2"]
    for r in got:
        i = int(r["extra_info"]["id"][1:])
        assert r["prompt"] == rows[i]["messages"]
        assert r["reward_model"] == {"style": "model", "ground_truth": f"reference {i}"}
        assert r["extra_info"]["history"] == HISTORY and r["extra_info"]["language"] == "en"
        assert r["data_source"] == "peer_rl/hand"


def test_bad_fraction_and_nothing_to_export_are_refused(tmp_path):
    with pytest.raises(ValueError, match="val-fraction"):
        export_verl([row(0)], tmp_path, val_fraction=1.0)
    with pytest.raises(ValueError, match="no text-only"):
        export_verl([row(0, images=["f.jpg"])], tmp_path)


def jsonl(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def key(prompt, solution) -> tuple:
    """A row by its content: the policy chat and the reference reply."""
    return (json.dumps([[m["role"], m["content"]] for m in prompt], ensure_ascii=False), solution)


@pytest.fixture
def sample(tmp_path):
    """The bundled sample, its grpo files read here (not through peer-rl's loader): the
    text-only rows of the training files and of the held-out *_test files."""
    root = tmp_path / "root"
    copy_sample(root)     # build_sample's output: tests/data/test_sample_stats_import.py
    files = sorted((root / "grpo").glob("*.jsonl"))
    assert [f.name for f in files] == ["textual.jsonl", "textual_test.jsonl", "visual.jsonl",
                                       "visual_test.jsonl"]
    rows = {f.name: jsonl(f) for f in files}
    text = lambda names: [r for n in names for r in rows[n] if not r.get("images")]  # noqa: E731
    return {"root": root, "n_rows": sum(map(len, rows.values())),
            "train": text(["textual.jsonl", "visual.jsonl"]),
            "test": text(["textual_test.jsonl", "visual_test.jsonl"])}


def contents(path) -> list[tuple]:
    return [key(r["prompt"], r["reward_model"]["ground_truth"]) for r in read(path)]


def test_cli_on_the_bundled_sample_keeps_held_out_rows_out_of_train(sample, tmp_path, capsys):
    train, test = sample["train"], sample["test"]
    assert (len(train), len(test)) == (152, 67)      # the sample's card: 152 + 67 textual rows
    out = tmp_path / "v"
    assert main(["data", "to-verl", str(sample["root"]), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    got = {s: contents(out / f"{s}.parquet") for s in ("train", "val", "test")}
    assert len(got["val"]) == round(0.05 * 152) == 8 and len(got["train"]) == 152 - 8
    assert sorted(got["train"] + got["val"]) == sorted(key(r["messages"], r["solution"])
                                                      for r in train)
    assert sorted(got["test"]) == sorted(key(r["messages"], r["solution"]) for r in test)
    held_out = {key(r["messages"], r["solution"]) for r in test} - \
        {key(r["messages"], r["solution"]) for r in train}
    assert len(held_out) == 67                      # no held-out row is also a training row
    assert not held_out & set(got["train"] + got["val"])
    for s in ("train", "val", "test"):
        assert {r["extra_info"]["split"] for r in read(out / f"{s}.parquet")} == {s}
    visual = sample["n_rows"] - 152 - 67
    assert f"skipped {visual}: visual" in printed and "test: 67 rows" in printed
    assert main(["data", "to-verl", str(sample["root"]), "--out", str(out)]) == 2   # not empty
    assert "--force" in capsys.readouterr().err


def test_a_rerun_with_force_leaves_no_split_of_the_earlier_run(sample, tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["data", "to-verl", str(sample["root"]), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    assert main(["data", "to-verl", str(sample["root"]), "--out", str(out), "--force",
                 "--val-fraction", "0"]) == 0
    assert "removed val.parquet" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == [".peer-rl-out.json", "notes.txt",
                                                      "test.parquet", "to-verl.json",
                                                      "train.parquet"]
    assert len(read(out / "train.parquet")) == 152 and len(read(out / "test.parquet")) == 67
    assert (out / "notes.txt").read_text() == "mine"        # not to-verl's: left alone


def test_a_same_named_file_no_run_wrote_is_refused_not_deleted(sample, tmp_path, capsys):
    out = tmp_path / "v"
    out.mkdir()
    datasets.Dataset.from_list([{"x": 1}]).to_parquet(str(out / "val.parquet"))
    before = (out / "val.parquet").read_bytes()
    assert main(["data", "to-verl", str(sample["root"]), "--out", str(out), "--force",
                 "--val-fraction", "0"]) == 2
    err = capsys.readouterr().err
    assert "holds files `peer-rl data to-verl` did not write (val.parquet)" in err
    assert (out / "val.parquet").read_bytes() == before and not (out / "train.parquet").exists()


def test_an_output_inside_the_input_root_is_refused(sample, capsys):
    root = sample["root"]
    assert main(["data", "to-verl", str(root), "--out", str(root / "verl")]) == 2
    assert "inside the input" in capsys.readouterr().err and not (root / "verl").exists()
