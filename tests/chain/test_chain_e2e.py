"""The smollm2 chain's recipes end to end on a random Llama of SmolLM2's layout (grouped-query
attention, tied embeddings, ChatML, pad = eos, an English-only card), written as GGUF and
converted like the real one, so CI needs no download: the SFT output is the GRPO start, the
judge directory is the reward model, the evaluation reads the GRPO checkpoint, and the report
lists what ran. Several methods and seeds in one report: tests/chain/test_run.py."""
import json
from pathlib import Path

import pytest
import yaml

from gguf_writer import tiny_llama, write_gguf
from peer_rl.chain.run import run_chain
from peer_rl.models.gguf import convert_gguf
from peer_rl.models.pinned import CARD_FILE, write_card
from peer_rl.trainer.shipped_adapters import SHIPPED_FROM

# every stage kind once: each is its own Ray cluster (~35-40 s), so one of each
STAGES = ["sft", "judge", "grpo_peer_rur_s0", "diversity_peer_rur_s0"]


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
@pytest.mark.long          # ~2.5 min: four stages, each its own Ray cluster
def test_the_chain_hands_each_stage_on(smollm2_shaped, tmp_path, capsys):
    out = tmp_path / "chain"
    local = "ray.address=local"
    rc = run_chain("smollm2", [
        f"out={out}", f"smollm2={smollm2_shaped}", "seeds=[0]", "grpo_steps=1",
        f"sft_args=trainer.total_steps=1 trainer.save_freq=0 {local}",
        f"rm_args=trainer.total_steps=1 trainer.save_freq=0 {local}",
        "grpo_args=data.train_batch_size=2 actor.ppo_mini_batch_size=2 rollout.n=4 "
        f"rollout.response_length=24 trainer.save_freq=1 {local}",
        "eval_args=limit=2 diversity.n=2 model.max_tokens=24",
    ], only=STAGES)
    assert rc == 0, capsys.readouterr()
    sft, judge = out / "sft" / "final", out / "judge" / "final"
    run = out / "grpo" / "peer_rur_s0"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["model"]["path"] == str(sft) and cfg["reward_model"]["path"] == str(judge)
    assert cfg["data"]["languages"] == ["english"]
    # the card travels: SFT'd and GRPO'd policies stay English-only
    assert json.loads((run / "final" / CARD_FILE).read_text())["languages"] == ["english"]
    assert cfg["algorithm"]["rur"]["enable"] is True
    assert (sft / CARD_FILE).exists() and (judge / CARD_FILE).exists()
    div = json.loads((out / "eval" / "peer_rur_s0_step1" / "diversity" / "report.json")
                     .read_text())
    assert div["manifest"]["parties"]["model"]["path"] == str(
        out / "grpo" / "peer_rur_s0" / "checkpoints" / "step_1" / "policy" / "model")
    assert div["summary"]["judge_reward"]["model"] == str(judge)
    assert div["summary"]["judge_reward"]["replies"] == 4          # limit 2 x n 2
    assert div["summary"]["left_out_languages"] == {"chinese": 34}   # grpo/textual_test.jsonl
    md = (out / "report.md").read_text()
    held = md[md.index("## Held-out"):]
    assert [line.split(" | ")[0] for line in held.splitlines()
            if line.startswith("| ") and "policy" not in line] == ["| peer_rur @ step 1"]
    # the GRPO run in the training table: one run, one step
    assert "| peer_rur | 1 | 1 |" in md and "| peer |" not in md
    assert Path(out / "logs" / "grpo_peer_rur_s0.log").exists()
    # another start model than the shipped adapters': both stages trained here, and said why
    for stage, name in (("sft", "policy"), ("judge", "judge")):
        log = (out / "logs" / f"{stage}.log").read_text()
        assert f"the shipped SmolLM2 {name} was trained on other inputs" in log, log[-2000:]
        assert "start_model" in log.split("other inputs", 1)[1].split(")", 1)[0]
        # trained by the supervised launcher, not merged from the shipped adapter
        assert (out / stage / "ray_train").is_dir()
        assert not (out / stage / "final" / SHIPPED_FROM).exists()
