"""A small local Ray cluster for the trainer's driver-side tests whose actors are plain classes
(worker groups, the weight-sync driver): joined if a module before them left one running. And
the stopped-and-resumed `peer-rl train` run that tests/trainer/test_run_async.py (the
look-ahead, dynamic sampling, SIGTERM and resume) and tests/trainer/test_lora_run.py (LoRA
adapters: the reference, the checkpoint, the export, the sync) both read: one run of minutes
instead of two."""
import json
import os

import pytest
from train_util import metrics, train, train_and_signal_after


@pytest.fixture(scope="module")
def ray_session():
    import ray

    if ray.is_initialized():
        yield ray
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


MAX_DRAWS = 2        # algorithm.filter_groups.max_num_gen_batches of the run below
ASYNC_LORA_RUN = ["trainer.async_training.staleness=1", "algorithm.filter_groups.enable=true",
                  "algorithm.filter_groups.metric=reward",
                  f"algorithm.filter_groups.max_num_gen_batches={MAX_DRAWS}",
                  "algorithm.filter_groups.on_limit=train_short", "model.lora.rank=8"]


@pytest.fixture(scope="session")
def async_lora_run(tmp_path_factory, grpo_models) -> dict:
    """`peer-rl train` in a fresh process with trainer.async_training.staleness=1, dynamic
    sampling (at most MAX_DRAWS draws a step) and LoRA adapters of rank 8 (model.lora.merge=auto:
    the CPU engines get merged weights): SIGTERM once step 1 is logged, so the run stops after
    step 2 with only that step checkpointed (save_freq=0: checkpoints only at the end), then
    `resume=auto` to step 3 (checkpointed, final/ exported). Returns the output directory, what
    the first run left behind before the second touched it, and the second run's process."""
    out = tmp_path_factory.mktemp("train_async_lora")
    # checkpoints only at the end (save_freq=0): step_2 exists only if the signal wrote it
    code, stdout, stderr = train_and_signal_after(out, grpo_models, 1, "trainer.total_steps=3",
                                                  "trainer.save_freq=0", *ASYNC_LORA_RUN)
    first = {"code": code, "stdout": stdout, "stderr": stderr, "recs": metrics(out),
             "spans": _spans(out), "checkpoints": sorted(p.name for p in
                                                         (out / "checkpoints").iterdir()),
             "final": (out / "final").exists()}
    resumed = train(out, grpo_models, "trainer.total_steps=3", "resume=auto", *ASYNC_LORA_RUN)
    return {"out": out, "first": first, "resumed": resumed, "max_draws": MAX_DRAWS}


def _spans(out) -> dict:
    """(step, stage) -> its first span (a stage repeats in a step when dynamic sampling
    draws again)."""
    spans: dict = {}
    for s in map(json.loads, (out / "timeline.jsonl").read_text().splitlines()):
        spans.setdefault((s["step"], s["stage"]), s)
    return spans
