"""A small local Ray cluster for the trainer's driver-side tests whose actors are plain classes
(worker groups, the weight-sync driver): joined if a module before them left one running."""
import os

import pytest


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
