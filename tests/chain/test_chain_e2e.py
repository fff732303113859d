"""The smollm2 chain's recipes end to end on a random Llama of SmolLM2's layout (grouped-query
attention, tied embeddings, ChatML, pad = eos, an English-only card), written as GGUF and
converted like the real one, so CI needs no download: the SFT output (trained here, the shipped
adapter being for other inputs) is the GRPO start, the judge directory is the reward model, and
the report lists what ran. The judge stage is the SFT stage's code with the other recipe, and
the held-out evaluations are the commands docs/reproduce-peer-rur.md runs
(tests/test_runbook.py): this test runs the SFT and GRPO stages against a judge placed where
the chain keeps it. Several methods and seeds in one report: tests/chain/test_run.py."""
import json
import shutil
from pathlib import Path

import pytest
import yaml

from gguf_writer import tiny_llama, write_gguf
from peer_rl.chain.run import run_chain
from peer_rl.models.gguf import convert_gguf
from peer_rl.models.pinned import CARD_FILE, write_card
from peer_rl.trainer.shipped_adapters import SHIPPED_FROM

# each stage is its own Ray cluster (~35-40 s): the policy's SFT and the GRPO run it starts
STAGES = ["sft", "grpo_peer_rur_s0"]


@pytest.fixture(scope="module")
def smollm2_shaped(tmp_path_factory) -> str:
    from peer_rl.supervised.tiny_models import build_tokenizer

    tmp = tmp_path_factory.mktemp("smollm2_shaped")
    tok = build_tokenizer(tmp / "tok")._tokenizer      # byte-level BPE on the sample's text
    specials = {t: tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    assert specials == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    gguf = write_gguf(tmp / "m.gguf", tiny_llama(tok.get_vocab_size()), tok, quant="Q4_1")
    out = convert_gguf(gguf, tmp / "model")
    write_card(out, {"name": "smollm2-shaped", "languages": ["english"],
                     "modalities": ["textual"]})
    return str(out)


@pytest.mark.e2e
@pytest.mark.long          # ~1.5 min: two stages, each its own Ray cluster
def test_the_chain_hands_each_stage_on(smollm2_shaped, grpo_models, tmp_path, capsys):
    out = tmp_path / "chain"
    local = "ray.address=local"
    args = [f"out={out}", f"smollm2={smollm2_shaped}", "seeds=[0]", "grpo_steps=1",
            f"sft_args=trainer.total_steps=1 trainer.save_freq=0 {local}",
            "grpo_args=data.train_batch_size=2 actor.ppo_mini_batch_size=2 rollout.n=4 "
            f"rollout.response_length=24 trainer.save_freq=1 {local}"]
    assert run_chain("smollm2", args, only=["sft"]) == 0, capsys.readouterr()
    # the judge stage's output where the chain keeps it (the tiny trained judge), then the
    # chain again: the SFT stage is done, the GRPO stage starts from it
    shutil.copytree(grpo_models["judge"], out / "judge" / "final")
    assert run_chain("smollm2", args, only=STAGES) == 0, capsys.readouterr()
    sft, judge = out / "sft" / "final", out / "judge" / "final"
    run = out / "grpo" / "peer_rur_s0"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["model"]["path"] == str(sft) and cfg["reward_model"]["path"] == str(judge)
    assert cfg["data"]["languages"] == ["english"]
    # the card travels: SFT'd and GRPO'd policies stay English-only
    assert json.loads((run / "final" / CARD_FILE).read_text())["languages"] == ["english"]
    assert cfg["algorithm"]["rur"]["enable"] is True
    assert (sft / CARD_FILE).exists()
    md = (out / "report.md").read_text()
    # the GRPO run in the training table: one run, one step
    assert "| peer_rur | 1 | 1 |" in md and "| peer |" not in md
    assert Path(out / "logs" / "grpo_peer_rur_s0.log").exists()
    # another start model than the shipped adapter's: the stage trained here, and said why
    log = (out / "logs" / "sft.log").read_text()
    assert "the shipped SmolLM2 policy was trained on other inputs" in log, log[-2000:]
    assert "start_model" in log.split("other inputs", 1)[1].split(")", 1)[0]
    # trained by the supervised launcher, not merged from the shipped adapter
    assert (out / "sft" / "ray_train").is_dir()
    assert not (out / "sft" / "final" / SHIPPED_FROM).exists()
