"""peer_rl.workers.devices: a worker computes on its own bundle's devices, and a pool given GPUs where
CUDA does not work stops at start-up naming the pool (this machine has no CUDA driver)."""
import pytest
import torch

from peer_rl.workers import devices


def test_outside_a_pool_cuda_is_used_wherever_it_works(monkeypatch):
    monkeypatch.delenv(devices.POOL_ENV, raising=False)
    assert devices.use_cuda() is torch.cuda.is_available()


def test_a_pool_without_gpus_computes_on_the_cpu(monkeypatch):
    monkeypatch.setenv(devices.POOL_ENV, "retrieval:0")
    assert devices.use_cuda() is False and devices.device() == "cpu"


def test_a_gpu_pool_without_cuda_stops_naming_the_pool_and_what_to_check(monkeypatch):
    assert not torch.cuda.is_available()          # the premise: a machine without CUDA
    monkeypatch.setenv(devices.POOL_ENV, "reward_model:0.5")
    with pytest.raises(devices.NoCudaError,
                       match=r"pool 'reward_model' was given 0.5 GPU\(s\) a worker \(resources"
                             r"\.reward_model\.gpus_per_worker\), but CUDA is not available .*"
                             r"nvidia-smi.*resources\.reward_model\.gpus_per_worker=0"):
        devices.use_cuda()


def test_a_gpu_policy_rank_without_cuda_never_falls_back_to_gloo(monkeypatch):
    """The policy rank asks before it joins any group or loads a byte: it stops, naming its
    pool, instead of training on the CPU over gloo (as it did when it asked
    torch.cuda.is_available() alone)."""
    from peer_rl.workers.policy import PolicyWorker

    monkeypatch.setenv(devices.POOL_ENV, "actor:1")
    with pytest.raises(devices.NoCudaError, match="pool 'actor'"):
        PolicyWorker(0, 1, "127.0.0.1", 0, "/no/such/model")


def test_a_malformed_pool_spec_is_named(monkeypatch):
    monkeypatch.setenv(devices.POOL_ENV, "actor:many")
    with pytest.raises(ValueError, match="PEER_RL_POOL='actor:many'"):
        devices.use_cuda()
