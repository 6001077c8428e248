#!/usr/bin/env bash
# On the GPU machine, after build.sh: write random-weight models (0.5B speculator + TARGET shape) and
# run `specq bench ttft` for the lengths given. Usage: ttft.sh TARGET_SHAPE LENGTHS [REPS]
# Production settings: CUDA graphs off, the worker's batch-invariant default (auto: off on a GPU);
# BATCH_INVARIANT=both runs both modes (twice the device time). TTFT_ARGS: more `specq bench ttft`
# options (e.g. "--window 8192" or "--scorer full"); TAG names the output files (ttft-SHAPE[-TAG].*).
set -euo pipefail
cd "$(dirname "$0")/../.."
shape=${1:-7b}; lengths=${2:-8192,32768}; reps=${3:-3}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# The device's PyTorch loads an older libstdc++ first, and llama.cpp then crashes loading a model
# (tokenizer init): preload the system's, so score math can run on the GPU through torch.
export LD_PRELOAD=${LD_PRELOAD:-/lib/x86_64-linux-gnu/libstdc++.so.6}
# CUDA graphs: off, as production runs them (EngineOptions.cuda_graphs; the engine sets
# GGML_CUDA_DISABLE_GRAPHS itself). With them on this benchmark crashed on 2026-12-02 (docs/engine.md).
out=${OUT:-/tmp/out}; mkdir -p "$out" /tmp/models
tag=${TAG:+-$TAG}
max=$(echo "$lengths" | tr ',' '\n' | sort -n | tail -1)
ctx=$(( max + 2048 ))
vocab=.gpu/ggml-vocab-qwen2.gguf
for s in 0.5b "$shape"; do
  f=/tmp/models/$s.gguf
  if [ ! -f "$f" ]; then
    # free the disk for the big shapes: keep only the speculator and this target
    for old in /tmp/models/*.gguf; do case "$old" in */0.5b.gguf|"$f") ;; *) rm -f "$old" ;; esac; done
    python3 -m specq.cli bench make-model --shape "$s" --vocab "$vocab" --n-ctx "$ctx" --out "$f"
  fi
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
SPECQ_LLAMA_LOG=${SPECQ_LLAMA_LOG:-0} python3 -m specq.cli bench ttft --lengths "$lengths" --reps "$reps" --keep 0.3 --batch-invariant "${BATCH_INVARIANT:-auto}" \
  --target /tmp/models/$shape.gguf --speculator /tmp/models/0.5b.gguf --n-ctx "$ctx" \
  ${TTFT_ARGS:-} --out "$out/ttft-$shape$tag.json" --plot "$out/ttft-$shape$tag.png" 2>&1 | tee "$out/ttft-$shape$tag.log"
