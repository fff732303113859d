"""The GRPO runtime: the single controller, placement of the pools, the worker groups, checkpoints, metrics."""
