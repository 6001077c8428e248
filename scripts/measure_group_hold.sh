#!/usr/bin/env bash
# Group sizes with and without SPECQ_GROUP_HOLD (docs/serving.md "Holding a claim for a whole group"):
# `specq up` with 4 slots on this machine's CPU and tiny random-weight models (specq/testing/synthetic.py),
# then `specq bench serve --documents`: 6 documents x 4 questions, all sent at once, mode specprefill.
# A diagnostic of the mechanism (how many jobs ran in groups, of what size), not a speed row.
#
#   bash scripts/measure_group_hold.sh HOLD [OUT.json]    # e.g. 0, then 2, then 0, then 2
set -u
cd "$(dirname "$0")/.."
h=${1:?usage: measure_group_hold.sh HOLD [OUT.json]}; out=${2:-/tmp/group-hold-$h.json}
models=${TINY_MODELS:-/tmp/specq-tiny-models}; mkdir -p "$models"
[ -f "$models/target.gguf" ] || .venv/bin/python -c "
from pathlib import Path
from specq.testing.synthetic import write_qwen2_gguf
write_qwen2_gguf(Path('$models/target.gguf'), 'tiny', seed=0, n_layer=4)
write_qwen2_gguf(Path('$models/speculator.gguf'), 'tiny', seed=0, n_layer=2)" || exit 1
port=$((8300 + ${h%.*})); home=/tmp/group-hold-home-$h; rm -rf "$home"
env SPECQ_HOME="$home" SPECQ_API_PORT=$port SPECQ_TARGET="$models/target.gguf" SPECQ_SPECULATOR="$models/speculator.gguf" \
  SPECQ_N_GPU_LAYERS=0 SPECQ_N_CTX=4096 SPECQ_SLOTS=4 SPECQ_GROUP_HOLD="$h" SPECQ_N_THREADS=1 \
  .venv/bin/specq up > "$home.log" 2>&1 &
pid=$!
for i in $(seq 200); do curl -sf localhost:$port/readyz 2>/dev/null | grep -q '"workers_ready":[1-9]' && break; sleep 1; done
.venv/bin/specq bench serve --url http://127.0.0.1:$port --docs 6 --questions 4 --doc-tokens 1800 --chars-per-token 1 \
  --max-tokens 24 --mode specprefill --documents --label "hold $h" --out "$out" 2>&1 | tail -8
kill -TERM $pid; wait $pid
echo "group claims: $(grep -c 'group claim:' "$home.log"); held claims: $(grep -c 'holding the claim' "$home.log")"
