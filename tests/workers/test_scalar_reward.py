"""ESCRAG-R1's scalar reward model end to end: `train-rm recipe=escrag_rm_tiny` (Bradley-Terry on
Ray Train, 2 FSDP2 ranks), `eval pairs` on held-out pairs, and the vLLM pooling engine of the
reward pool agreeing with transformers' forward of the same checkpoint."""
import json

import pytest
import torch

from peer_rl.cli import main
from peer_rl.config.worker_settings import JudgeSettings

pytestmark = pytest.mark.e2e


@pytest.fixture
def trained_rm(trained_scalar_rm):
    from pathlib import Path

    return Path(trained_scalar_rm)


def test_bt_training_learns_the_pairs_and_generalises_to_held_out_dialogues(trained_rm, tmp_path):
    recs = [json.loads(x) for x in (trained_rm / "metrics.jsonl").read_text().splitlines()]
    assert recs[0]["loss"] == pytest.approx(0.693, abs=0.05)     # log 2: a random head
    assert recs[-1]["loss"] < 0.4 and recs[-1]["pairwise_accuracy"] > 0.8
    # the command in this process (its engine is the same; a child interpreter costs ~40 s here)
    assert main(["eval", "pairs", "--model", str(trained_rm / "final"),
                 "--out", str(tmp_path / "pairs.json"), "--kv-cache-gib", "0.5"]) == 0
    rep = json.loads((tmp_path / "pairs.json").read_text())
    assert rep["pairs"] == 134 and rep["pairwise_accuracy"] > 0.8 and rep["mean_margin"] > 0
    assert set(rep["by_language"]) == {"en", "zh"}


def test_the_pooling_engine_scores_like_transformers(trained_rm):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from peer_rl.supervised.bradley_terry import rm_messages
    from peer_rl.protocol import ScalarItem
    from peer_rl.workers.scalar_reward import ScalarRewardWorker

    model_dir = str(trained_rm / "final")
    hist = [{"role": "seeker", "content": "I failed the exam again."}]
    items = [ScalarItem(hist, "That must sting after all your work. What happened?", "en"),
             ScalarItem(hist, "Exams don't matter. Move on.", "en"),
             ScalarItem([{"role": "seeker", "content": "我又没考上。"}], "又一次落空，真的很难受。",
                        "zh")]
    # float32, as the transformers forward it is compared with to 1e-4 (auto would be bfloat16
    # on a CPU with AVX512-BF16)
    worker = ScalarRewardWorker(model_dir, JudgeSettings(kv_cache_gib=0.5, max_model_len=1024,
                                                         dtype="float32"))
    try:
        got = worker.score(items)
    finally:
        worker.close()
    tok = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        want = [float(hf(**tok(tok.apply_chat_template(rm_messages(it.history, it.reply, it.lang),
                                                   tokenize=False),
                               return_tensors="pt", add_special_tokens=False)).logits[0, 0])
                for it in items]
    assert got == pytest.approx(want, abs=1e-4)
    assert got[0] > got[1]          # the trained model prefers the supportive reply
