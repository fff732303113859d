#!/usr/bin/env bash
# verl's trainer with examples/verl/peer_rur.yaml (docs/verl.md). Needs .venv-verl
# (bash scripts/setup_verl.sh), a GPU node, the data from `peer-rl data to-verl`, and the trained
# judge served at $JUDGE_URL (`vllm serve $JUDGE`). Extra arguments are verl overrides.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
POLICY=${POLICY:?set POLICY to the SFT policy (path or hub id)}
JUDGE=${JUDGE:?set JUDGE to the judge directory (judge_template.json beside its weights)}
exec "${PYTHON:-.venv-verl/bin/python}" -m verl.trainer.main_ppo \
  --config-path="$HERE" --config-name=peer_rur \
  actor_rollout_ref.model.path="$POLICY" \
  reward.reward_kwargs.judge_path="$JUDGE" \
  reward.reward_kwargs.judge_url="${JUDGE_URL:-http://127.0.0.1:8000/v1}" \
  data.train_files="${DATA:-verl-data}/train.parquet" \
  data.val_files="${DATA:-verl-data}/val.parquet" \
  trainer.n_gpus_per_node="${NGPUS:-8}" \
  "$@"
