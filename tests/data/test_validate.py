"""`peer-rl data check` on the bundled sample and on precisely corrupted copies of it."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from peer_rl.cli import main
from peer_rl.data.layout import discover
from peer_rl.data.loading import InvalidDataError, load_subset
from peer_rl.data.bundled import sample_root
from peer_rl.data.validate import check_file


@pytest.fixture()
def root(tmp_path) -> Path:
    dst = tmp_path / "peer"
    shutil.copytree(sample_root(), dst)
    return dst


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _write(path: Path, rows: list) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n"
                            for r in rows), encoding="utf-8")


def _check(root: Path, capsys, *extra) -> tuple[int, str, str]:
    code = main(["data", "check", str(root), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sample_passes(root, capsys):
    code, out, err = _check(root, capsys)
    assert code == 0, err
    assert "0 invalid" in out and err == ""


def test_sample_has_every_file_and_30_rows(root):
    files = {df.rel: len(check_file(df).rows) for df in discover(root)}
    for lang in ("en", "zh"):
        for kind in ("text", "visual"):
            for split in ("train", "test"):
                assert files[f"ser/{lang}/{kind}_{split}.jsonl"] >= 30
    for name in ("grpo/textual.jsonl", "grpo/visual.jsonl", "sft/textual_train.jsonl",
                 "sft/visual_test.jsonl", "safety/test.jsonl"):
        assert files[name] >= 30


def test_every_preference_verdict_in_both_languages(root):
    for lang, vocab in (("en", "The first sentence is better|The second sentence is better|"
                                "The two sentences are almost good|Neither sentence is available"),
                        ("zh", "第一句更好|第二句更好|差不多|都不可用")):
        seen = {r["messages"][8]["content"] for f in (root / "ser" / lang).glob("*.jsonl")
                for r in _rows(f)}
        assert seen == set(vocab.split("|"))


def _corrupt_line(root, rel, line_no, mutate):
    path = root / rel
    rows = _rows(path)
    rows[line_no - 1] = mutate(rows[line_no - 1])
    _write(path, rows)
    return path


CASES = {
    "truncated json": ("ser/en/text_train.jsonl", 3,
                       lambda r: json.dumps(r)[:80], "<line>: a complete JSON object"),
    "missing field": ("grpo/textual.jsonl", 5,
                      lambda r: {k: v for k, v in r.items() if k != "solution"},
                      "solution: missing; expected a non-empty string"),
    "swapped roles": ("ser/zh/text_test.jsonl", 2,
                      lambda r: {**r, "messages": [r["messages"][0], r["messages"][2],
                                                   r["messages"][1]] + r["messages"][3:]},
                      "messages[1].role: expected 'user', found 'assistant'"),
    "short ser chat": ("ser/en/text_test.jsonl", 4,
                       lambda r: {**r, "messages": r["messages"][:7]},
                       "messages: expected 9 messages (system + 4 x user/assistant), found 7"),
    "english verdict in zh file": ("ser/zh/text_train.jsonl", 6,
                                   lambda r: {**r, "messages": r["messages"][:2] + [
                                       {"role": "assistant", "content": "True"}] + r["messages"][3:]},
                                   "messages[2].content: step 1 verdict in zh: one of 正确 / 错误, "
                                   "found 'True'"),
    "empty history": ("grpo/textual.jsonl", 7, lambda r: {**r, "history": []},
                      "history: expected a non-empty dialogue history, found []"),
    "wrong type": ("safety/test.jsonl", 1, lambda r: {**r, "group": 3},
                   "group: expected one of crisis, harmful_request, boundary, found int"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_corruption_is_reported_with_path_line_field(root, capsys, case):
    rel, line_no, mutate, expected = CASES[case]
    path = _corrupt_line(root, rel, line_no, mutate)
    code, out, err = _check(root, capsys)
    assert code == 1
    assert f"{path}:{line_no}: {expected}" in err
    assert "Traceback" not in err
    assert "1 invalid" in out


def test_missing_image(root, capsys):
    (root / "grpo" / "images" / "face_sad_2.png").unlink()
    code, out, err = _check(root, capsys)
    assert code == 1
    assert "images[1]: image file" in err and "face_sad_2.png does not exist" in err
    assert "grpo/visual.jsonl:" in err


def test_undecodable_image(root, capsys):
    (root / "ser" / "images" / "face_happy_1.png").write_bytes(b"not a png")
    code, _, err = _check(root, capsys)
    assert code == 1 and "images[0]: a PNG/JPEG/WEBP image" in err and "not a PNG" in err


def test_invalid_utf8(root, capsys):
    path = root / "sft" / "textual_train.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[9] = lines[9][:40] + b"\xff\xfe" + lines[9][40:]
    path.write_bytes(b"\n".join(lines))
    code, _, err = _check(root, capsys)
    assert code == 1
    assert f"{path}:10: <line>: valid UTF-8; invalid byte at column 41" in err


def test_skip_invalid_counts_per_reason(root, capsys):
    _corrupt_line(root, "grpo/textual.jsonl", 1, lambda r: {**r, "history": []})
    _corrupt_line(root, "grpo/textual.jsonl", 2, lambda r: {**r, "history": []})
    _corrupt_line(root, "ser/en/text_train.jsonl", 1, lambda r: json.dumps(r)[:10])
    code, out, _ = _check(root, capsys, "--skip-invalid")
    assert code == 0
    assert "2 problem(s): empty history" in out and "1 problem(s): invalid json" in out
    assert "--skip-invalid: 3 invalid row(s) would be skipped" in out


def test_loader_refuses_then_skips_and_counts(root):
    _corrupt_line(root, "grpo/textual.jsonl", 4, lambda r: {**r, "solution": ""})
    with pytest.raises(InvalidDataError, match=r"textual.jsonl:4: solution: expected a non-empty"):
        load_subset(root, "grpo", "textual")
    res = load_subset(root, "grpo", "textual", skip_invalid=True)
    total = len(_rows(root / "grpo" / "textual.jsonl"))
    assert len(res.dataset) == total - 1 and res.n_skipped == 1


def test_loader_types_and_absolute_images(root):
    ds = load_subset(root, "grpo", "visual").dataset
    assert ds.features["history"].feature["content"].dtype == "string"
    assert all(Path(p).is_file() for p in ds[0]["images"])
    ser = load_subset(root, "ser", "text_test").dataset
    assert len(ser[0]["messages"]) == 9


def test_missing_root_is_a_clear_error(tmp_path, capsys):
    code = main(["data", "check", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2 and "not a directory" in err


@pytest.mark.e2e   # a peer-rl CLI subprocess
def test_console_script_exit_codes(root):
    """The installed entry point: non-zero exit, no traceback."""
    _corrupt_line(root, "safety/test.jsonl", 2, lambda r: {**r, "history": []})
    proc = subprocess.run([sys.executable, "-m", "peer_rl.cli", "data", "check", str(root)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert "safety/test.jsonl:2: history" in proc.stderr and "Traceback" not in proc.stderr


def _visual_row_image(root, value):
    _corrupt_line(root, "ser/en/visual_train.jsonl", 1, lambda r: {**r, "images": [value]})


def test_images_must_stay_inside_the_data_root(root, capsys, monkeypatch, tmp_path):
    """Issue 24.11: image paths could be absolute or climb out of the root with `..`."""
    from PIL import Image

    outside = tmp_path / "outside.png"
    Image.new("RGB", (8, 8)).save(outside)
    _visual_row_image(root, "../../outside.png")
    code, _, err = _check(root, capsys)
    assert code == 1 and "images[0]: a path inside the data root" in err and "leaves it" in err
    _visual_row_image(root, str(outside))
    code, _, err = _check(root, capsys)
    assert code == 1 and "leaves it" in err
    monkeypatch.setenv("PEER_RL_ALLOW_IMAGES_OUTSIDE_ROOT", "1")
    assert _check(root, capsys)[0] == 0


def test_only_png_jpeg_webp_under_the_pixel_cap_are_opened(root, capsys):
    from PIL import Image

    from peer_rl.prompts.multimodal import MAX_IMAGE_PIXELS

    images = root / "ser" / "images"
    Image.new("RGB", (8, 8)).save(images / "face.bmp")
    _visual_row_image(root, "images/face.bmp")
    code, _, err = _check(root, capsys)
    assert code == 1 and "not a PNG/JPEG/WEBP image" in err
    Image.new("1", (8000, MAX_IMAGE_PIXELS // 8000 + 1)).save(images / "huge.png")
    _visual_row_image(root, "images/huge.png")
    code, _, err = _check(root, capsys)
    assert code == 1 and "over the 40,000,000 cap" in err
