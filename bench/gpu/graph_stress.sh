#!/usr/bin/env bash
# On the GPU machine, after build.sh (same carry, /tmp/site holds the CUDA build): the CUDA-graph
# stress run of issue 14 — production settings (graphs ON, engine defaults on a GPU, patch 0002
# toggling the speculator's eval callback), scoring at 32K/64K plus model drafting, RUNS fresh
# processes; crashes reported in $OUT/graph-stress.json and graph-stress.log.
# Usage: graph_stress.sh [TARGET_SHAPE=7b] [LENGTHS=32768,65536] [RUNS=20]
# A control run with graphs off: GGML_CUDA_DISABLE_GRAPHS=1 EXTRA=--allow-graphs-off bash bench/gpu/graph_stress.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
shape=${1:-7b}; lengths=${2:-32768,65536}; runs=${3:-20}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# as ttft.sh: the device's PyTorch loads an older libstdc++ first (torch score math needs the system's)
export LD_PRELOAD=${LD_PRELOAD:-/lib/x86_64-linux-gnu/libstdc++.so.6}
out=${OUT:-/tmp/out}; mkdir -p "$out" /tmp/models
max=$(echo "$lengths" | tr ',' '\n' | sort -n | tail -1)
ctx=$(( max + 2048 ))
vocab=.gpu/ggml-vocab-qwen2.gguf
[ -f "$vocab" ] || { echo "no $vocab: run bench/gpu/prepare.sh here and carry .gpu"; exit 1; }
for s in 0.5b "$shape"; do
  f=/tmp/models/$s.gguf
  if [ ! -f "$f" ]; then
    for old in /tmp/models/*.gguf; do case "$old" in */0.5b.gguf|"$f") ;; *) rm -f "$old" ;; esac; done
    python3 -m specq.cli bench make-model --shape "$s" --vocab "$vocab" --n-ctx "$ctx" --out "$f"
  fi
done
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader
python3 bench/gpu/graph_stress.py --target /tmp/models/$shape.gguf --speculator /tmp/models/0.5b.gguf \
  --lengths "$lengths" --runs "$runs" --budget-s "${BUDGET_S:-540}" --out "$out/graph-stress.json" ${EXTRA:-} \
  2>&1 | tee "$out/graph-stress.log"
