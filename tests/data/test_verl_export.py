"""`peer-rl data to-verl`: grpo rows as the parquet verl's RL dataset reads, every row accounted
for (written to train or val, or skipped and counted)."""
import json

import datasets
import pytest

from peer_rl.cli import main
from peer_rl.data.bundled import build_sample
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


def test_cli_on_the_bundled_sample_accounts_for_every_row(tmp_path, capsys):
    root = tmp_path / "root"
    build_sample(root)
    lines = [json.loads(x) for f in sorted((root / "grpo").glob("*.jsonl"))
             for x in f.read_text().splitlines() if x.strip()]
    text = sum(1 for r in lines if not r.get("images"))
    assert main(["data", "to-verl", str(root), "--out", str(tmp_path / "v")]) == 0
    out = capsys.readouterr().out
    n_train = len(read(tmp_path / "v" / "train.parquet"))
    n_val = len(read(tmp_path / "v" / "val.parquet"))
    assert n_train + n_val == text and n_val == round(0.05 * text)
    assert f"skipped {len(lines) - text}: visual" in out
    assert main(["data", "to-verl", str(root), "--out", str(tmp_path / "v")]) == 2   # not empty
    assert "--force" in capsys.readouterr().err
