"""The method plug-ins on their own: which method serves which reward kind, which pools each
declares, and that a step's scoring depends on the arguments alone (the step, the rows), with
every pool call named by that step. The groups here are in-process recorders: the workers'
own behaviour is tested in tests/workers and end to end in tests/trainer/test_controller.py."""
from types import SimpleNamespace

import numpy as np
import pytest

from peer_rl.config.schema import ConfigError, load_config
from peer_rl.methods import Groups, Method, method_class, register
from peer_rl.methods.escrag_r1 import EscragR1
from peer_rl.methods.peer import Peer
from peer_rl.protocol import JudgeResult, Sample, Similarities, request_seed
from peer_rl.trainer.timeline import Timing

STEPS = "Step 1: a.\nStep 2: b.\nStep 3: c.\nStep 4: I hear you."


class Recorder:
    """A worker group that answers from `answer(method, items, *args)` and records each call."""

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def __len__(self):
        return 1

    def call(self, method, items, *args, step=None):
        self.calls.append((method, step, items, args))
        return self.answer(method, items, *args)


def _rollout(method, prompts, sampling):
    return [Sample(uid=p.uid, prompt_ids=[1], response_ids=[2, 3], response_logprobs=[0.0, 0.0],
                   text=STEPS if j % 2 == 0 else "no structure", policy_version=0)
            for p in prompts for j in range(sampling.n)]


def _judge(method, items):
    return [JudgeResult(step_verdicts=[True, True, i % 3 == 0], preference=1,
                        preference_ok=i % 2 == 0, reward=float(i % 4), parse_failures=0, asked=4)
            for i, _ in enumerate(items)]


def _rows(n):
    return [{"messages": [{"role": "user", "content": f"p{i}"}], "history":
             [{"role": "user", "content": f"seeker says {i}"}], "language": "english",
             "solution": "ref"} for i in range(n)]


def test_each_reward_kind_is_served_by_one_registered_method():
    assert method_class(load_config([])) is Peer
    assert method_class(load_config(["reward_model.kind=prm_orm", "reward_model.path=a",
                                     "reward_model.outcome_path=b"])) is Peer
    assert method_class(load_config(["recipe=escrag_r1_tiny"])) is EscragR1


def test_the_pools_a_method_declares_follow_its_config():
    assert Peer.pools(load_config(["algorithm.rur.enable=false"])) == {"rollout", "reward_model"}
    assert Peer.pools(load_config(["algorithm.rur.enable=true"])) == {
        "rollout", "reward_model", "redundancy"}
    escrag = load_config(["recipe=escrag_r1_tiny"])
    assert "retrieval" in EscragR1.pools(escrag) and escrag.retrieval.enable
    assert "retrieval" not in EscragR1.pools(load_config(["recipe=escrag_r1_tiny",
                                                          "retrieval.enable=false"]))


def test_a_second_method_with_a_taken_name_is_refused():
    class Again(Method):
        name = "peer"
    with pytest.raises(ValueError, match="registered twice"):
        register(Again)


def test_peer_scoring_is_a_function_of_rows_and_step_and_names_the_step_in_every_call():
    cfg = load_config(["algorithm.rur.enable=false", "rollout.n=2", "trainer.seed=7"])
    rollout, judge = Recorder(_rollout), Recorder(_judge)
    method = Peer.from_config(Groups(rollout=rollout, reward_model=judge), cfg)
    rows = _rows(3)
    first = method.score(rows, 5, Timing(5))
    method.score(rows, 9, Timing(9))                 # another step in between changes nothing
    again = method.score(rows, 5, Timing(5))
    assert [c[1] for c in rollout.calls + judge.calls] == [5, 9, 5, 5, 9, 5]
    # request seeds as the protocol defines them: (run seed, 0-based step, stream, prompt)
    seeds = [p.seed for p in rollout.calls[0][2]]
    assert seeds == [request_seed(7, 4, "rollout", i, 2) for i in range(3)]
    coins = [it.candidate_first for it in judge.calls[0][2]]
    assert coins == [it.candidate_first for it in judge.calls[2][2]]
    assert coins == list(np.random.default_rng([7, 4]).random(6) < 0.5)
    np.testing.assert_array_equal(first.reweighted, again.reweighted)
    np.testing.assert_array_equal(first.reweighted, first.rewards)  # RUR off: r~ = r
    assert first.rewards.tolist() == [0.0, 1.0, 2.0, 3.0, 0.0, 1.0]
    # half the samples have the four steps: format rate 0.5; step 3 true for items 0 and 3
    assert first.metrics["reward/format_rate"] == 0.5
    assert first.metrics["reward/step3_true_rate"] == pytest.approx(2 / 6)


def test_peer_rur_divides_by_the_redundancy_pools_answer():
    cfg = load_config(["algorithm.rur.enable=true", "rollout.n=2"])
    s = np.array([0.5, 0.0, 1.0, 0.25])
    rur = Recorder(lambda m, replies, hist, n: Similarities(s, s[::-1], np.ones(4), np.ones(4)))
    method = Peer.from_config(Groups(rollout=Recorder(_rollout), reward_model=Recorder(_judge),
                                     redundancy=rur), cfg)
    out = method.score(_rows(2), 3, Timing(3))
    assert rur.calls[0][:2] == ("similarities", 3)
    assert rur.calls[0][3] == ([["seeker says 0"], ["seeker says 1"]], 2)   # histories, G
    # r = [0, 1, 2, 3]; r~ = r / ((1 + s_hist)(1 + s_group)), worked out by hand
    np.testing.assert_allclose(out.reweighted, [0.0, 1 / (1.0 * 2.0), 2 / (2.0 * 1.0),
                                           3 / (1.25 * 1.5)])


def test_dialogue_enable_picks_whole_conversations_and_its_pools():
    from peer_rl.config.schema import load_config

    cfg = load_config(["recipe=dialogue_tiny"])
    method = method_class(cfg)
    assert method.name == "dialogue"
    assert method.pools(cfg) == {"rollout", "reward_model", "redundancy", "seeker"}
    assert method_class(load_config(["recipe=tiny"])).name == "peer"


def test_a_reward_kind_no_method_serves_is_a_config_error():
    # past the schema's check, as a config built by a plug-in's own schema might be
    cfg = SimpleNamespace(reward_model=SimpleNamespace(kind="pairwise"))
    with pytest.raises(ConfigError, match="reward_model.kind='pairwise'"):
        method_class(cfg)


def _sample_rows(k: int) -> tuple[list[dict], list[list[str]]]:
    """Four textual sample rows as a run loads them with data.max_history_turns=k (two of them
    longer than 8 turns), and each one's whole history in the file, read with json."""
    import json

    from peer_rl.data.bundled import sample_root
    from peer_rl.trainer.run import load_prompts

    lines = (sample_root() / "grpo" / "textual.jsonl").read_text().splitlines()
    rows = {r["id"]: r for r in load_prompts(load_config(["data.train_files=[grpo/textual.jsonl]",
                                                          f"data.max_history_turns={k}"]))}
    ids = [f"grpo/textual.jsonl:{i}" for i in (1, 5, 6, 138)]
    whole = [[t["content"] for t in json.loads(lines[int(i.rsplit(":", 1)[1]) - 1])["history"]]
             for i in ids]
    return [rows[i] for i in ids], whole


def _contents(history) -> list[str]:
    return [t["content"] for t in history]


@pytest.mark.parametrize("k", [0, 3])
def test_every_pool_of_a_peer_step_sees_the_history_in_the_policys_prompt(k):
    rows, whole = _sample_rows(k)
    assert max(map(len, whole)) > 8
    seen = [w[-k:] if k else w for w in whole]              # what the policy's prompt holds
    for r, s, w in zip(rows, seen, whole):
        text = r["messages"][-1]["content"]
        assert all(t in text for t in s) and not any(t in text for t in w[:len(w) - len(s)])
    cfg = load_config(["algorithm.rur.enable=true", "rollout.n=2"])
    rur = Recorder(lambda m, replies, hist, n: Similarities(*[np.zeros(len(replies))] * 4))
    judge = Recorder(_judge)
    rollout = Recorder(_rollout)
    Peer.from_config(Groups(rollout=rollout, reward_model=judge, redundancy=rur), cfg).score(
        rows, 1, Timing(1))
    assert [p.messages for p in rollout.calls[0][2]] == [r["messages"] for r in rows]
    assert [_contents(it.history) for it in judge.calls[0][2]] == [s for s in seen for _ in "ab"]
    assert rur.calls[0][3][0] == seen                                   # RUR's s_hist


@pytest.mark.parametrize("k", [0, 3])
def test_every_pass_of_an_escrag_step_sees_the_history_in_the_policys_prompt(k):
    """Both passes' prompts, the scalar reward model's items, the retrieval queries and RUR
    take the same turns; the retrieval's exclusion gets the whole dialogue."""
    from peer_rl.protocol import RetrievalHits

    rows, whole = _sample_rows(k)
    seen = [w[-k:] if k else w for w in whole]
    cfg = load_config(["recipe=escrag_r1_tiny", "algorithm.rur.enable=true", "rollout.n=2"])
    think = "<think>why</think>\nI hear you."
    rollout = Recorder(lambda m, prompts, sampling: [
        Sample(uid=p.uid, prompt_ids=[1], response_ids=[2], response_logprobs=[0.0], text=think)
        for p in prompts for _ in range(sampling.n)])
    retrieval = Recorder(lambda m, queries, k: RetrievalHits(
        [[{"score": 1.0, "id": "e", "response": "an exemplar"}]] * len(queries),
        [0] * len(queries), 0.0, [0]))
    rm = Recorder(lambda m, items: [1.0] * len(items))
    rur = Recorder(lambda m, replies, hist, n: Similarities(*[np.zeros(len(replies))] * 4))
    EscragR1.from_config(Groups(rollout=rollout, reward_model=rm, redundancy=rur,
                                retrieval=retrieval), cfg).score(rows, 1, Timing(1))
    initial, refined = rollout.calls[0][2], rollout.calls[1][2]
    for prompts, per_prompt in ((initial, 1), (refined, 2)):
        for p in prompts:
            text, s, w = p.messages[-1]["content"], seen[p.uid], whole[p.uid]
            assert all(t in text for t in s) and not any(t in text for t in w[:len(w) - len(s)])
        assert len(prompts) == len(rows) * per_prompt
    queries = retrieval.calls[0][2]
    assert [_contents(q.history) for q in queries] == [s for s in seen for _ in "ab"]
    assert [_contents(q.dialogue_history) for q in queries] == [w for w in whole for _ in "ab"]
    # refined replies then initial ones, each prompt-major
    assert [_contents(it.history) for it in rm.calls[0][2]] == [s for s in seen for _ in "ab"] * 2
    assert rur.calls[0][3][0] == seen
