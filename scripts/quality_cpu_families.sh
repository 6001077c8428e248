#!/usr/bin/env bash
# The CPU runs of `specq bench quality` (#18) on document families (--family: one document, up to 16
# questions; the service's caches make each later question cheap), in steps HALF:LENGTH:N. Every step
# appends to its journal and skips what it holds, so running this again resumes where it stopped.
#   nohup nice -n 19 scripts/quality_cpu_families.sh >> bench/results/quality-cpu-families.log 2>&1 &
# The families' saved KV is kept in CACHE_DIR (default ~/.cache/specq/quality-families-kv; "" = memory
# only), so a run resumed after a stop hits its family's document instead of prefilling it again.
# Environment: TAG (default quality-cpu-families), THREADS (default 2), FAMILY (default 16),
# STEPS (default "answer:4000:40 answer:16000:20 recall:8000:200 recall:16000:200 recall:4000:200").
set -uo pipefail
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$(dirname "$0")/.."
tag=${TAG:-quality-cpu-families}; threads=${THREADS:-2}; family=${FAMILY:-16}
R=bench/results
echo "start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg) $(git describe --always --dirty)"
for step in ${STEPS:-answer:4000:40 answer:16000:20 recall:8000:200 recall:16000:200 recall:4000:200}; do
  IFS=: read -r half len n <<< "$step"
  journal=$R/$tag-$half-$len.jsonl
  .venv/bin/specq bench quality "$half" --journal "$journal" --lengths "$len" --n "$n" --family "$family" \
    --threads "$threads" --cache-dir "${CACHE_DIR-$HOME/.cache/specq/quality-families-kv}" > /dev/null
  echo "step $step done rc $? $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo "all done $(date -u +%FT%TZ)"
