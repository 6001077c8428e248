#!/usr/bin/env bash
# On the GPU machine, after build.sh (same carry of .gpu): serial vs pipelined SpecPrefill TTFT on ONE
# H200, 7B-shape target + 0.5B-shape speculator (random weights), with each stage's scoring time S_i
# and prefill time P_i and the bound they imply with the speculator on a second device (issue 21).
# Usage: pipeline.sh [LENGTHS] [REPS]   (default 32768,131072 and 2; one call of < 10 minutes:
# model writing ~45 s, 32K ~1 min, 131K ~4 min; BUDGET_S stops starting new rounds after 480 s)
# Env: NP (n_parallel values, default "1,8"), SPECULATOR_GPU (default -1: one device).
set -euo pipefail
cd "$(dirname "$0")/../.."
lengths=${1:-32768,131072}; reps=${2:-2}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# as in ttft.sh: the system's libstdc++ before PyTorch's older one; CUDA graphs off for every mode
export LD_PRELOAD=${LD_PRELOAD:-/lib/x86_64-linux-gnu/libstdc++.so.6}
export GGML_CUDA_DISABLE_GRAPHS=${GGML_CUDA_DISABLE_GRAPHS-1}
export BUDGET_S=${BUDGET_S:-480}
out=${OUT:-/tmp/out}; mkdir -p "$out" /tmp/models
max=$(echo "$lengths" | tr ',' '\n' | sort -n | tail -1)
ctx=$(( max + 2048 ))
vocab=.gpu/ggml-vocab-qwen2.gguf
for s in 0.5b 7b; do
  f=/tmp/models/$s.gguf
  if [ ! -f "$f" ]; then
    for old in /tmp/models/*.gguf; do case "$old" in */0.5b.gguf|*/7b.gguf) ;; *) rm -f "$old" ;; esac; done
    python3 -m specq.cli bench make-model --shape "$s" --vocab "$vocab" --n-ctx "$ctx" --out "$f"
  fi
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
SPECQ_LLAMA_LOG=${SPECQ_LLAMA_LOG:-0} python3 bench/gpu/pipeline.py /tmp/models/7b.gguf /tmp/models/0.5b.gguf \
  "$lengths" "$out/pipeline-7b.json" "$reps" 2>&1 | tee "$out/pipeline-7b.log"
