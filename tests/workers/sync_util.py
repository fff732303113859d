"""Drive one weight sync in-process: the sending side runs in a thread (it blocks in the
collective until the engine, in the calling thread, has joined and received)."""
from __future__ import annotations

import socket
import threading

import numpy as np
import torch

from peer_rl.workers import weight_sync


def _run(sender, receiver):
    box: dict = {}

    def target():
        try:
            box["sent"] = sender()
        except BaseException as exc:   # re-raised in the caller
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    try:
        received = receiver()
    finally:
        t.join(timeout=300)
    if "error" in box:
        raise box["error"]
    return box["sent"], received


def push_state(engine, state: dict[str, torch.Tensor], bucket_bytes: int = 1 << 20,
               dtype: str = "float32"):
    """Broadcast a plain state dict (checkpoint names) into a RolloutWorker."""
    metas = [(k, list(v.shape), dtype) for k, v in state.items()]
    plan = [weight_sync.TensorMeta(k, tuple(s), d) for k, s, d in metas]
    store = weight_sync.make_store("127.0.0.1", 0, 2, 0)

    def sender():
        group = weight_sync.open_group(store, 0, 2, "gloo")
        return weight_sync.send(group, state.values(), plan, bucket_bytes, torch.device("cpu"))

    def receiver():
        engine.join_weight_sync("127.0.0.1", int(store.port), 1, 2, metas, bucket_bytes)
        return engine.receive_weights()

    return _run(sender, receiver)


def push_policy(policy, engine, bucket_bytes: int = 1 << 20) -> tuple[dict, int]:
    """One sync from an in-process PolicyWorker (world size 1) into a RolloutWorker, the way
    the controller drives it (peer_rl.trainer.sync_group)."""
    metas = policy.weight_metas(engine.engine_dtype())
    adapter_config = policy.adapter_config()
    addr, port = policy.host_weight_sync(2)

    def sender():
        policy.join_weight_sync()
        return policy.send_weights(metas, bucket_bytes)

    def receiver():
        engine.join_weight_sync(addr, port, 1, 2, metas, bucket_bytes, adapter_config)
        return engine.receive_weights()

    return _run(sender, receiver)


def update_batch(samples):
    """An UpdateBatch of the engine's samples (advantages +1, -1, +0.5, -0.5, repeated) and
    their full token sequences."""
    from peer_rl.protocol import UpdateBatch

    seqs = [s.prompt_ids + s.response_ids for s in samples]
    T = max(map(len, seqs))
    ids, attn, resp = (np.zeros((len(seqs), T), np.int64) for _ in range(3))
    for i, (s, seq) in enumerate(zip(samples, seqs)):
        ids[i, :len(seq)], attn[i, :len(seq)] = seq, 1
        resp[i, len(s.prompt_ids):len(seq)] = 1
    adv = np.resize(np.array([1.0, -1.0, 0.5, -0.5], np.float32), len(seqs))
    return UpdateBatch(ids, attn, resp, adv), seqs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def max_gap(policy_lp: np.ndarray, engine_lp: list[list[float]], seqs) -> float:
    """Largest |policy - engine| log-prob over every token after the first of each sequence
    (the policy's are token-aligned (N, T); the engine's prompt log-probs start at token 1)."""
    return max(float(np.abs(policy_lp[i, 1:len(s)] - np.array(engine_lp[i])).max())
               for i, s in enumerate(seqs))
