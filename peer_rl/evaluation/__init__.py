"""Evaluations a paper reports: ESC-Eval, SAGE, the PEER safety probes and reply diversity.

Layers, top to bottom: `run` (the `peer-rl eval` driver) -> `runner` (cases in lock-step, one
batch per party) -> protocol programs (`esc`, `sage`, `safety`, `diversity`) -> pure helpers
(`prompts`, `parse`, `supporter`, `report`). Parties are `endpoints` (OpenAI-compatible HTTP or
a local vLLM engine); finished cases live in a resumable `store`.
"""
