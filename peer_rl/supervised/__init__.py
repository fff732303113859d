"""The supervised stages: examples, the Bradley-Terry loss, their config, the tiny models."""
