#!/usr/bin/env bash
# Issue 15's CPU benchmark: one worker with SLOTS slots against one with 1 slot, on the real pair, same
# `specq bench serve` workload (streamed /v1/chat/completions, ignore_eos, all jobs at t=0, baseline mode).
#   scripts/measure_cpu_slots.sh OUTDIR [DOCS] [DOC_TOKENS] [MAX_TOKENS] [SLOTS]
# defaults: 16 distinct ~100-token prompts, 256 output tokens, 4 slots (the issue's decode-heavy case);
# `... OUTDIR 16 500 64` is its 500-token / 64-token mix. Writes OUTDIR/cpu-slots{N}-{DOC_TOKENS}x{MAX_TOKENS}.json
# and the services' logs. Run it on a quiet machine: the JSONs record the load average.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: measure_cpu_slots.sh OUTDIR [DOCS] [DOC_TOKENS] [MAX_TOKENS] [SLOTS]}
docs=${2:-16}; doc_tokens=${3:-100}; max_tokens=${4:-256}; slots=${5:-4}
models=${SPECQ_MODELS:-$HOME/.cache/specq/models}
mkdir -p "$out"
for n in "$slots" 1; do
  home=$(mktemp -d); port=$(( 8300 + n ))
  SPECQ_HOME=$home SPECQ_API_PORT=$port SPECQ_SLOTS=$n SPECQ_TIME_LIMIT=3000 \
    SPECQ_TARGET=$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf SPECQ_SPECULATOR=$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    .venv/bin/specq up > "$out/cpu-slots$n-service.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    curl -sf "localhost:$port/readyz" 2>/dev/null | grep -q '"workers_ready":[1-9]' && break; sleep 1
  done
  .venv/bin/specq bench serve --url "http://127.0.0.1:$port" --docs "$docs" --doc-tokens "$doc_tokens" \
    --max-tokens "$max_tokens" --chars-per-token 2.6 --mode baseline --label "specq $n slot(s), CPU" \
    --out "$out/cpu-slots$n-${doc_tokens}x$max_tokens.json"
  kill -TERM $pid; wait $pid || true
  rm -rf "$home"
done
