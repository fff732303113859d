"""Request seeds: every sample of a run gets its own, whichever worker serves it."""
import itertools

import pytest

from peer_rl.protocol import Prompt, request_seed, seeded, shard


def test_a_seed_worked_by_hand():
    # run seed 1, step 2, stream "rollout_refined" (1), prompt 3: fields 15|22|2|16|8 bits
    assert request_seed(1, 2, "rollout_refined", 3, n=4) == \
        ((((1 * 2**22) + 2) * 2**2 + 1) * 2**16 + 3) * 2**8
    assert request_seed(2**15 + 1, 2, "rollout_refined", 3, n=4) == \
        request_seed(1, 2, "rollout_refined", 3, 4)
    top = request_seed(2**15 - 1, 2**22 - 1, "eval", 2**16 - 1, n=256) + 255
    assert top < 2**63                                     # a valid int64 seed, sample included


def test_no_two_samples_of_a_multi_worker_run_share_a_seed():
    """4 steps x 2 streams x 24 prompts x G = 4 over 3 rollout workers: vLLM seeds sample j of a
    request with seed + j. The scheme before (seed + step, plus position-in-shard x n) gave
    prompt k of every worker the same seeds."""
    G, seen = 4, []
    for step, stream in itertools.product(range(4), ("rollout", "rollout_refined")):
        prompts = seeded([Prompt(uid=i, messages=[]) for i in range(24)], 7, step, stream, G)
        for part in shard(prompts, 3):                     # what each worker receives
            seen += [p.seed + j for p in part for j in range(G)]
    assert len(seen) == 4 * 2 * 24 * G == len(set(seen))
    old = [7 * 100_003 + step + i * G + j for step in range(4) for part in shard(range(24), 3)
           for i, _ in enumerate(part) for j in range(G)]
    assert len(set(old)) < len(old)                        # the old scheme does collide


def test_out_of_range_fields_are_refused():
    with pytest.raises(ValueError, match=r"index=65536 outside \[0, 2\^16\)"):
        request_seed(0, 0, "rollout", 2**16, 4)
    with pytest.raises(ValueError, match=r"n=257 outside \[1, 2\^8\]"):
        request_seed(0, 0, "rollout", 0, 257)


def test_shard_is_contiguous_near_equal_and_keeps_order():
    assert shard(list("abcdefg"), 3) == [["a", "b", "c"], ["d", "e"], ["f", "g"]]
    assert shard([1, 2], 3) == [[1], [2], []]
    assert shard([], 2) == [[], []]


def test_each_pool_method_the_methods_call_declares_its_dispatch():
    """The table in peer_rl.protocol's docstring, held against the worker classes."""
    from peer_rl.protocol import Dispatch, dispatch_of
    from peer_rl.workers.redundancy import RedundancyWorker
    from peer_rl.workers.retrieval import RetrievalWorker
    from peer_rl.workers.rollout import RolloutWorker
    from peer_rl.workers.scalar_reward import ScalarRewardWorker
    from peer_rl.workers.unifireward import PairRewardWorker, UnifiRewardWorker

    declared = {(c.__name__, m): dispatch_of(c, m) for c, m in (
        (RolloutWorker, "generate"), (UnifiRewardWorker, "score"), (UnifiRewardWorker, "chat"),
        (PairRewardWorker, "score"), (PairRewardWorker, "chat"), (ScalarRewardWorker, "score"),
        (RedundancyWorker, "encode"), (RedundancyWorker, "similarities"),
        (RetrievalWorker, "search"))}
    assert [k for k, v in declared.items() if v is Dispatch.ONE] == [
        ("RedundancyWorker", "similarities")]


def test_every_policy_call_the_trainer_makes_goes_to_all_ranks_and_nothing_else_can():
    """The controller's and the weight sync's policy calls are declared Dispatch.ALL; a method
    that is not (here `shutdown`, which the placement layer sends rank by rank) is refused
    before any rank is asked."""
    from peer_rl.protocol import Dispatch, dispatch_of
    from peer_rl.trainer.worker_group import PolicyGroup
    from peer_rl.workers.policy import PolicyWorker

    for method in ("update", "compute_log_prob", "save_checkpoint", "load_checkpoint",
                   "export_hf", "health", "weight_metas", "host_weight_sync",
                   "join_weight_sync", "send_weights"):
        assert dispatch_of(PolicyWorker, method) is Dispatch.ALL, method
    group = PolicyGroup([], PolicyWorker, lambda: None)
    with pytest.raises(TypeError, match="PolicyWorker.shutdown declares no dispatch mode"):
        group.submit("shutdown")


def test_gathering_flattens_lists_and_concatenates_batch_types():
    from peer_rl.protocol import RetrievalHits, gather

    assert gather([[1, 2], [3]]) == [1, 2, 3]
    got = gather([RetrievalHits([[{"id": "a"}]], [1], 0.5, [10]),
                  RetrievalHits([[{"id": "b"}], []], [0, 2], 0.25, [11])])
    assert got == RetrievalHits([[{"id": "a"}], [{"id": "b"}], []], [1, 0, 2], 0.75, [10, 11])
