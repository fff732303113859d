"""`peer-rl train recipe=dialogue_tiny` as a user runs it: whole conversations between the tiny
policy (vLLM rollout engine) and a simulated seeker in a pool of its own (a vLLM engine), each
turn judged by the trained tiny judge (vLLM), RUR from the embedding model, two steps of FSDP2
updates; then what the run wrote is read back."""
import json

import pytest
from train_util import metrics, train

pytestmark = pytest.mark.e2e


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
        assert len({s["uid"] for s in turns}) == 1 and turns[0]["uid"] == d // 2
        # the seeker speaks after every turn but one that its emotion ended
        assert (turns[-1]["seeker"] is None) == (turns[-1]["end"] in ("success", "failure"))
        assert all(s["seeker"] is not None for s in turns[:-1])
        assert 0 <= turns[-1]["emotion"] <= 100
