"""The exemplar index holds the training split unless told otherwise: `data preference` writes
`exemplars/test.jsonl` beside `exemplars/train.jsonl`, and the CCJ evaluation asks about the test
dialogues, so their chosen replies must not be retrieval material by default."""
import json

import numpy as np
import pytest

from peer_rl.cli import main
from peer_rl.config.schema import ConfigError, load_config


def _row(rid, dialogue, seeker, reply):
    return {"id": rid, "language": "en", "dialogue": dialogue, "response": reply,
            "history": [{"role": "seeker", "content": seeker}]}


TRAIN = [_row("tr-1", "d1", "I failed my driving test again.", "That stings, twice over."),
         _row("tr-2", "d2", "My sister stopped calling me.", "That silence sounds lonely."),
         _row("tr-3", "d3", "I can't sleep before exams.", "The night before feels endless.")]
TEST = [_row("te-1", "d4", "My dog is sick and I can't afford the vet.",
             "Worrying about him and the money at once is a lot."),
        _row("te-2", "d5", "I got passed over for the promotion.",
             "After all that work, that must hurt.")]


class FakeEncoder:
    """Texts to fixed-length vectors by their bytes: deterministic, no model to load."""
    dim = 8

    def encode(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for j, b in enumerate(t.encode()):
                out[i, j % self.dim] += b
        return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture
def root(tmp_path):
    d = tmp_path / "data" / "exemplars"
    d.mkdir(parents=True)
    for name, rows in (("train.jsonl", TRAIN), ("test.jsonl", TEST)):
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return tmp_path / "data"


@pytest.fixture
def fake_encoder(monkeypatch):
    import peer_rl.models.encoders

    monkeypatch.setattr(peer_rl.models.encoders, "load_embedding_model", lambda *a, **k: FakeEncoder())


def _ids(index_dir):
    return [json.loads(x)["id"] for x in (index_dir / "exemplars.jsonl").read_text().splitlines()]


def test_a_file_split_is_read_from_its_name():
    from peer_rl.data.layout import file_split

    assert [file_split(n) for n in ("exemplars/test.jsonl", "grpo/textual_test.jsonl",
                                    "exemplars/train.jsonl", "exemplars/exemplars.jsonl",
                                    "grpo/textual.jsonl", "ser/en/text_train.jsonl")] == \
        ["test", "test", "train", "train", "train", "train"]


def test_index_build_holds_the_train_rows_unless_told_and_says_so(root, tmp_path, fake_encoder,
                                                                 capsys):
    # by default: exemplars/train.jsonl's 3 rows; exemplars/test.jsonl's 2 are left out
    assert main(["index", "build", str(root), "--out", str(tmp_path / "idx")]) == 0
    out = capsys.readouterr().out
    assert "3 exemplar(s) from 1 file(s) (train 3); left out: test 2 row(s)" in out, out
    assert "3 vectors (train 3)" in out, out
    info = json.loads((tmp_path / "idx" / "index.json").read_text())
    assert info["count"] == 3 and info["splits"] == {"train": 3}
    assert _ids(tmp_path / "idx") == ["tr-1", "tr-2", "tr-3"]
    # told: both files, 3 + 2 = 5 rows
    assert main(["index", "build", str(root), "--out", str(tmp_path / "both"),
                 "--splits", "train,test"]) == 0
    out = capsys.readouterr().out
    assert "5 exemplar(s) from 2 file(s) (test 2, train 3)" in out, out
    info = json.loads((tmp_path / "both" / "index.json").read_text())
    assert info["count"] == 5 and info["splits"] == {"test": 2, "train": 3}
    assert sorted(_ids(tmp_path / "both")) == ["te-1", "te-2", "tr-1", "tr-2", "tr-3"]


def test_index_build_names_a_split_with_no_files_and_an_unknown_one(tmp_path, fake_encoder,
                                                                   capsys):
    d = tmp_path / "data" / "exemplars"
    d.mkdir(parents=True)
    (d / "test.jsonl").write_text(json.dumps(TEST[0]) + "\n", encoding="utf-8")
    assert main(["index", "build", str(tmp_path / "data"), "--out", str(tmp_path / "i")]) == 2
    err = capsys.readouterr().err
    assert "no exemplar file of the split(s) train" in err and "--splits test" in err, err
    assert main(["index", "build", str(tmp_path / "data"), "--out", str(tmp_path / "i"),
                 "--splits", "dev"]) != 0
    assert "expected one or more of train, test" in capsys.readouterr().err
    assert not (tmp_path / "i").exists()


def test_the_trainer_index_follows_retrieval_splits(root, tmp_path, fake_encoder):
    from peer_rl.retrieval.corpus import index_from_root, load_exemplars

    logged = []
    index_from_root(root, tmp_path / "idx", "fake", log=logged.append)
    assert _ids(tmp_path / "idx") == ["tr-1", "tr-2", "tr-3"]
    assert "(train 3); left out: test 2 row(s)" in logged[0]
    index_from_root(root, tmp_path / "idx", "fake", splits=("train", "test"), log=logged.append)
    assert len(_ids(tmp_path / "idx")) == 5 and len(logged) == 2     # other files: rebuilt
    index_from_root(root, tmp_path / "idx", "fake", splits=("train", "test"), log=logged.append)
    assert len(logged) == 2                                          # same files: kept
    rows, src = load_exemplars(root)
    assert len(rows) == 3 and src["splits"] == {"train": 3} and src["left_out"] == {"test": 2}
    assert list(load_config(["retrieval.splits=[train,test]"]).retrieval.splits) == \
        ["train", "test"]
    with pytest.raises(ConfigError, match=r"retrieval.splits: \['dev'\]"):
        load_config(["retrieval.splits=[dev]"])
