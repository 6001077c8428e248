#!/usr/bin/env bash
# The CPU runs of `specq bench quality` (#18), in stages of growing n: every stage appends to the
# same journals and skips what they hold, so running this again resumes where it stopped.
#   nohup nice -n 19 scripts/quality_cpu_run.sh > bench/results/quality-cpu-2026-12-01.log 2>&1 &
# Environment: TAG (default quality-cpu-2026-12-01), THREADS (default 1: under a load far above the core count one llama.cpp thread wastes less in spin-waits),
# STAGES (comma-separated "recall4K recall8K recall16K answer4K answer16K" targets; default the four below).
set -uo pipefail
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cd "$(dirname "$0")/.."
tag=${TAG:-quality-cpu-2026-12-01}
threads=${THREADS:-1}
R=bench/results
q() { .venv/bin/specq bench quality "$@" --threads "$threads"; }
recall() { q recall --journal "$R/$tag-recall.jsonl" --lengths "$1" --n "$2" --out "$R/$tag-recall.json" > /dev/null; }
answer() { q answer --journal "$R/$tag-answer-$1.jsonl" --lengths "$1" --n "$2" > /dev/null; }
echo "start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg) $(git describe --always --dirty)"
IFS=, read -r -a stages <<< "${STAGES:-3 2 1 2 1,12 8 4 12 4,40 20 10 40 20,200 200 200 40 20}"
for stage in "${stages[@]}"; do
  set -- $stage
  recall 4000 "$1"; recall 8000 "$2"; recall 16000 "$3"
  answer 4000 "$4"; answer 16000 "$5"
  echo "stage $stage done $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo "all done $(date -u +%FT%TZ)"
