"""Issue 24.7: an unreachable judge endpoint during the in-training evaluation is recorded
(`eval/errors`) and the diversity half still reports; nothing is raised into the training loop.
The rollout side is a real vLLM engine on the tiny policy, the judge a real HTTP client aimed
at a port nobody listens on."""
import socket

import pytest

from peer_rl.config.schema import load_config
from peer_rl.evaluation.in_training import InTrainingEval
from peer_rl.protocol import Dispatch, dispatch_of, gather, shard
from peer_rl.config.worker_settings import RolloutSettings

pytestmark = pytest.mark.e2e


class InProcessGroup:
    """The WorkerGroup calls the endpoints make, on workers in this process."""

    def __init__(self, workers):
        self.workers = workers

    def call(self, method, items, *args, step=None):
        """As WorkerGroup.call, by the method's declared dispatch."""
        if dispatch_of(type(self.workers[0]), method) is Dispatch.ONE:
            return getattr(self.workers[0], method)(items, *args)
        return gather([getattr(w, method)(p, *args)
                       for w, p in zip(self.workers, shard(items, len(self.workers))) if p])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.e2e   # loads the real multilingual sentence encoder
def test_an_unreachable_judge_is_recorded_and_training_goes_on(tiny_models, capsys):
    from peer_rl.models.encoders import MULTILINGUAL_USE, load_embedding_model
    from peer_rl.workers.rollout import RolloutWorker

    cfg = load_config([f"model.path={tiny_models['policy']}", "eval.diversity_prompts=2",
                       "eval.n=2", "eval.safety_probes=2", "eval.max_tokens=8",
                       f"eval.judge_url=http://127.0.0.1:{_closed_port()}/v1"])
    worker = RolloutWorker(tiny_models["policy"], RolloutSettings(kv_cache_gib=0.5))
    try:
        out = InTrainingEval(cfg).run(InProcessGroup([worker]), None,
                                      load_embedding_model(MULTILINGUAL_USE).encode, step=3)
    finally:
        worker.close()
    assert out["eval/errors"] == 1
    assert 0.0 <= out["eval/diversity/format_rate"] <= 1.0 and "eval/diversity/distinct_1" in out
    assert not any(k.startswith("eval/safety/") for k in out)
    err = capsys.readouterr().err
    assert "step 3: in-training evaluation (safety) failed and is skipped; training goes on" in err
