"""The reward-model kinds as plug-ins: a kind registered by a test is accepted at config load
and every lookup (method, worker class, models, plan, policy style, the schema's checks) reads
its declaration, not its name. The toy kind mixes declarations no built-in kind has (PEER's
method with the escrag style, a generative pair that allows retrieval), so a lookup that still
compared names would answer as for some built-in kind and fail here."""
import pytest

from peer_rl.config import reward_kinds
from peer_rl.config.reward_kinds import RewardKind, register_kind, registered_kinds
from peer_rl.config.schema import ConfigError, load_config

TOY = RewardKind("toy", method="peer", style="escrag",
                 worker="peer_rl.workers.unifireward:PairRewardWorker",
                 models=("path", "outcome_path"), judge_roles=("process", "outcome"),
                 tiny=False, retrieval=True)
PATHS = ["reward_model.kind=toy", "reward_model.path=/p", "reward_model.outcome_path=/o"]


@pytest.fixture
def toy(monkeypatch):
    """TOY registered for one test only."""
    monkeypatch.setattr(reward_kinds, "_KINDS", dict(reward_kinds._KINDS))
    return register_kind(TOY)


def test_the_built_in_kinds_are_registered_in_order():
    assert registered_kinds() == ("unifireward", "scalar", "prm_orm")


def test_an_unregistered_kind_fails_at_load_naming_the_registered_ones(toy):
    with pytest.raises(ConfigError, match=r"reward_model.kind='nope': expected one of "
                                          r"\('unifireward', 'scalar', 'prm_orm', 'toy'\)"):
        load_config(["reward_model.kind=nope"])


def test_a_kind_registered_twice_is_refused(toy):
    with pytest.raises(ValueError, match="'toy' registered twice"):
        register_kind(TOY)


def test_a_registered_kind_is_accepted_and_checked_by_what_it_declares(toy):
    # retrieval is allowed (no built-in kind but scalar allows it)
    assert load_config([*PATHS, "retrieval.enable=true"]).reward_model.kind == "toy"
    # no tiny stand-in: both models named, each with its judge role
    with pytest.raises(ConfigError, match=r"^reward_model.kind=toy: set reward_model.path \(the "
                                          r"process model\) and reward_model.outcome_path \(the "
                                          r"outcome model\)$"):
        load_config(["reward_model.kind=toy", "reward_model.path=/p"])
    with pytest.raises(ConfigError, match="kind=toy: only the unifireward judge is served"):
        load_config([*PATHS, "reward_model.lora_path=/a"])
    # it writes verdicts: the in-training safety probes need no other judge
    load_config([*PATHS, "trainer.eval_freq=2", "eval.safety_probes=2"])


def test_every_lookup_answers_from_the_declaration(toy):
    from peer_rl.evaluation.in_training import InTrainingEval
    from peer_rl.evaluation.supporter import Supporter
    from peer_rl.methods import method_class
    from peer_rl.methods.peer import Peer
    from peer_rl.models.local import BUNDLED
    from peer_rl.planning.plan import _models
    from peer_rl.trainer.resource_pools import PoolFactory

    cfg = load_config(PATHS)
    assert method_class(cfg) is Peer
    factory = PoolFactory(cfg, "/policy", "/judge")
    assert factory.worker_class("reward_model").__name__ == "PairRewardWorker"
    assert factory.reward_paths() == ("/judge", "/o")      # the resolved judge, then outcome
    assert _models(cfg) == {"policy": str(BUNDLED / "models" / "tiny" / "policy"),
                            "judge": "/p", "outcome": "/o"}
    assert InTrainingEval(cfg).style == Supporter("escrag")  # asked as ESCRAG-R1's policy


def test_a_kind_whose_method_is_not_registered_is_a_config_error(monkeypatch):
    from peer_rl.methods import method_class

    monkeypatch.setattr(reward_kinds, "_KINDS", dict(reward_kinds._KINDS))
    register_kind(RewardKind("orphan", method="absent", style="peer", worker="m:C"))
    with pytest.raises(ConfigError, match="'orphan' is scored by method 'absent', which is not "
                                          "registered; registered: dialogue, escrag_r1, peer"):
        method_class(load_config(["reward_model.kind=orphan"]))
