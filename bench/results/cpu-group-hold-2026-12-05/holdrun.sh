#!/usr/bin/env bash
# diagnostic: group sizes with and without SPECQ_GROUP_HOLD, tiny random-weight models on this CPU
set -u
cd /work/main
h=$1; port=$((8300 + ${h%.*})); home=/tmp/hold-home-$h; rm -rf $home
env SPECQ_HOME=$home SPECQ_API_PORT=$port SPECQ_TARGET=/tmp/tiny/target.gguf SPECQ_SPECULATOR=/tmp/tiny/speculator.gguf \
  SPECQ_N_GPU_LAYERS=0 SPECQ_N_CTX=4096 SPECQ_SLOTS=4 SPECQ_GROUP_HOLD=$h SPECQ_N_THREADS=1 \
  .venv/bin/specq up > /tmp/hold-up-$h.log 2>&1 &
pid=$!
for i in $(seq 200); do curl -sf localhost:$port/readyz 2>/dev/null | grep -q '"workers_ready":[1-9]' && break; sleep 1; done
.venv/bin/specq bench serve --url http://127.0.0.1:$port --docs 6 --questions 4 --doc-tokens 1800 --chars-per-token 1 \
  --max-tokens 24 --mode specprefill --documents --label "hold $h" --out /tmp/hold-$h.json 2>&1 | tail -8
kill -TERM $pid; wait $pid
grep -c "group claim:" /tmp/hold-up-$h.log; grep -c "holding the claim" /tmp/hold-up-$h.log
