#!/usr/bin/env bash
# On the GPU machine, after build.sh: write random-weight models of real shapes and run
# `specq bench drafters` (drafter step costs, verification vs single decode, decode speed-up at forced
# acceptance rates). Usage: drafters.sh [mtp|eagle3|all]   (default mtp)
#   mtp:    GLM-4.5-Air-shaped target with its MTP block (glm45-air-8e: every token's active path has the
#           real size, 8 routed experts in the file instead of 128) + the 0.5B Qwen2 speculator;
#           methods ngram, model, mtp. ~2.5 min of device time (27 GB written ~65 s).
#   eagle3: Qwen3-8B-shaped target + an EAGLE3 head of its shape + the 0.5B speculator;
#           methods ngram, model, eagle3. ~2 min.
# Both use the carried real Qwen2 vocabulary (151,665 tokens; GLM-4.5's own has 151,552).
# Overrides for a CPU proof run: PY, VOCAB, MTP_SHAPE, QWEN3_SHAPE, EAGLE3_SHAPE, SPEC_SHAPE, PROMPT, TOKENS,
# THREADS, REPEAT, MODELS, OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:-mtp}
py=${PY:-python3}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# as in ttft.sh: the device's PyTorch loads an older libstdc++ first. CUDA graphs: off, as production
# (EngineOptions.cuda_graphs); the 2026-12-02 rows in docs/speculative-decoding.md ran with them on.
if [ -f /lib/x86_64-linux-gnu/libstdc++.so.6 ]; then export LD_PRELOAD=${LD_PRELOAD:-/lib/x86_64-linux-gnu/libstdc++.so.6}; fi
out=${OUT:-/tmp/out}; models=${MODELS:-/tmp/models}; mkdir -p "$out" "$models"
vocab=${VOCAB:-.gpu/ggml-vocab-qwen2.gguf}
prompt=${PROMPT:-2048}; tokens=${TOKENS:-64}
extra=(); [ -n "${THREADS:-}" ] && extra+=(--threads "$THREADS"); [ -n "${REPEAT:-}" ] && extra+=(--repeat "$REPEAT")
spec=$models/spec-${SPEC_SHAPE:-0.5b}.gguf
need=("$spec")
case "$what" in mtp|all) need+=("$models/glm4moe-${MTP_SHAPE:-glm45-air-8e}.gguf") ;; esac
case "$what" in eagle3|all) need+=("$models/qwen3-${QWEN3_SHAPE:-8b}.gguf" "$models/eagle3-${EAGLE3_SHAPE:-8b}.gguf") ;; esac
# free the disk (64 GiB): keep only the files this run needs
for old in "$models"/*.gguf; do
  [ -e "$old" ] || continue
  keep=0; for f in "${need[@]}"; do [ "$old" = "$f" ] && keep=1; done
  [ $keep = 1 ] || rm -f "$old"
done
mk() {  # arch shape file
  [ -f "$3" ] || "$py" -m specq.cli bench make-model --arch "$1" --shape "$2" --vocab "$vocab" --n-ctx 16384 --out "$3"
}
mk qwen2 "${SPEC_SHAPE:-0.5b}" "$spec"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$what" = mtp ] || [ "$what" = all ]; then
  t=$models/glm4moe-${MTP_SHAPE:-glm45-air-8e}.gguf
  mk glm4moe "${MTP_SHAPE:-glm45-air-8e}" "$t"
  SPECQ_LLAMA_LOG=${SPECQ_LLAMA_LOG:-0} "$py" -m specq.cli bench drafters --methods ngram,model,mtp \
    --target "$t" --speculator "$spec" --prompt-tokens "$prompt" --max-tokens "$tokens" "${extra[@]}" \
    --out "$out/drafters-mtp-$rev.json" 2>&1 | tee "$out/drafters-mtp-$rev.log"
fi
if [ "$what" = eagle3 ] || [ "$what" = all ]; then
  t=$models/qwen3-${QWEN3_SHAPE:-8b}.gguf; h=$models/eagle3-${EAGLE3_SHAPE:-8b}.gguf
  mk qwen3 "${QWEN3_SHAPE:-8b}" "$t"
  mk eagle3 "${EAGLE3_SHAPE:-8b}" "$h"
  SPECQ_LLAMA_LOG=${SPECQ_LLAMA_LOG:-0} "$py" -m specq.cli bench drafters --methods ngram,model,eagle3 \
    --target "$t" --speculator "$spec" --drafter "$h" --prompt-tokens "$prompt" --max-tokens "$tokens" "${extra[@]}" \
    --out "$out/drafters-eagle3-$rev.json" 2>&1 | tee "$out/drafters-eagle3-$rev.log"
fi
