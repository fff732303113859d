"""A rollout engine sharded over two workers (rollout.tensor_model_parallel_size=2) inside the
Ray actor the placement layer makes for it, on CPU as a GPU cluster runs it (vLLM's
multiprocessing executor inside the actor), and a weight sync that reaches both workers.

Issue 56.1: left to choose, vLLM inside a Ray actor takes the actor's placement group and its
Ray executor, which refuses the actor's one bundle (on GPUs: "Placement group bundle cannot
have more than 1 GPU"; on this CPU: "current platform cpu does not support ray")."""
import threading

import pytest
import ray
import torch

from peer_rl.config.schema import load_config
from peer_rl.trainer.runtime import init_ray
from peer_rl.trainer.resource_pools import PoolFactory, _pool_pg
from peer_rl.workers.fsdp import load_pretrained, tied_duplicates, to_checkpoint_names
from peer_rl.workers.weight_sync import TensorMeta, make_store, open_group, send

pytestmark = pytest.mark.e2e


def _logprobs(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits.float().log_softmax(-1)[0]
    return [logp[t - 1, ids[t]].item() for t in range(1, len(ids))]


def test_a_two_worker_engine_starts_in_its_actor_and_both_workers_take_the_sync(tiny_models,
                                                                                tmp_path):
    cfg = load_config([f"trainer.output_dir={tmp_path}", f"model.path={tiny_models['policy']}",
                       "ray.address=local", "rollout.tensor_model_parallel_size=2",
                       "rollout.dtype=float32", "rollout.kv_cache_gib=0.1"])
    owned = not ray.is_initialized()
    init_ray(cfg)
    factory = PoolFactory(cfg, tiny_models["policy"], tiny_models["judge"])
    factory.pgs["rollout"] = _pool_pg("rollout", cfg.resources.rollout, 1, 300)
    engine = factory.start("rollout", 0)
    try:
        health = ray.get(engine.health.remote(), timeout=900)
        assert health["ok"] and health["dtype"] == "float32"

        # perturbed weights, in the checkpoint's names, sent by this thread as rank 0 to the
        # engine's two workers (ranks 1 and 2): each receives every tensor whole and vLLM cuts
        # its own shard, so the engine then computes what transformers computes with them
        model = load_pretrained(tiny_models["policy"])
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5 * p.std().clamp_min(0.02))
        tied = tied_duplicates(model)
        state = to_checkpoint_names(model, {k: v for k, v in model.state_dict().items()
                                            if k not in tied})
        metas = [(k, list(v.shape), "float32") for k, v in state.items()]
        store = make_store("127.0.0.1", 0, 3, 0)
        joins = engine.join_weight_sync.remote("127.0.0.1", int(store.port), 1, 3, metas,
                                               1 << 16, None, 60)
        group = open_group(store, 0, 3, "gloo", 60)
        assert ray.get(joins, timeout=120) == [1, 2]
        received = engine.receive_weights.remote(1)
        sender = threading.Thread(target=send, args=(
            group, list(state.values()), [TensorMeta(k, tuple(s), d) for k, s, d in metas],
            1 << 16, torch.device("cpu"), 60))
        sender.start()
        assert ray.get(received, timeout=300) == len(state)
        sender.join(timeout=60)

        ids = list(range(5, 45))
        engine_lp = ray.get(engine.prompt_logprobs.remote([ids]), timeout=120)[0]
        gap = max(abs(a - b) for a, b in zip(engine_lp, _logprobs(model, ids)))
        assert gap < 1e-4, gap
    finally:
        ray.kill(engine, no_restart=True)
        factory.shutdown()
        if owned:
            ray.shutdown()
