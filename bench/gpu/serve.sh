#!/usr/bin/env bash
# On the lent H200: `specq bench serve` against specq (8 slots and 1 slot) and llama-server, built from
# ONE CMake tree of the vendored llama.cpp (the patched wheel and llama-server together), 0.5B -> 7B
# random-weight shapes, no drafting on either side. Each stage fits one <= 10-minute call; the machine
# keeps /tmp only while calls follow each other. Run from the project root, carrying .gpu (made by
# bench/gpu/prepare.sh) and .whl (the service's wheels: bench/gpu/serve-wheels.sh, run here first).
#
#   bash bench/gpu/serve.sh build          # wheel + llama-server (~6-7 min), service wheels, models
#   bash bench/gpu/serve.sh specq 32768 64 # specq, 8 slots then 1 slot: 64 jobs of 32K-token documents
#   bash bench/gpu/serve.sh llama 32768 64 # llama-server -np 8, the same workload and client
#   bash bench/gpu/serve.sh specq 8192 64; bash bench/gpu/serve.sh llama 8192 64       # extra: 8K
#   CTX=135168 SLOTS_LIST=8 bash bench/gpu/serve.sh specq 131072 8; CTX=135168 bash bench/gpu/serve.sh llama 131072 8
#   SPECQ_SPEC_CACHE_SAVE=repeat bash bench/gpu/serve.sh specq 32768 64   # A/B: no speculator-cache saves of
#       one-off documents (docs/serving.md "Where the time goes"); files and labels carry "save-repeat"
#   QUESTIONS=8 MODE=auto bash bench/gpu/serve.sh specq 32768 64; QUESTIONS=8 bash bench/gpu/serve.sh llama 32768 64
#       # many questions, one document (#17): JOBS/QUESTIONS documents x QUESTIONS questions; files carry "-q8"
#   DOCUMENTS=1 QUESTIONS=8 MODE=auto SPECQ_SPEC_CACHE_SAVE=repeat SLOTS_LIST=8 bash bench/gpu/serve.sh specq 32768 64
#       # the same through specq's stored documents (`bench serve --documents`: each document uploaded once,
#       # questions as jobs naming its document_id, so group claims and the document caches apply; uploads
#       # not in the makespan); files and labels carry "-docs". The worker's SPECQ_CACHE_BYTES (2 GiB) holds
#       # ~1 prompt of 32K tokens of the 7B (~1.8 GB of KV): set it (e.g. SPECQ_CACHE_BYTES=$((32<<30)))
#       # to keep 8 documents; a set value names the files ("-cache32G")
#   bash bench/gpu/serve.sh image 32768   # the worker image's CMD/ENV (Dockerfile, compose.yaml) outside Docker, one job
#   bash bench/gpu/serve.sh calshadow 16384 32   # calibration through the service (questions/min) and the shadow
#       # rate's cost (0 against 0.05, Poisson arrivals, same job list): see the stage; CPU smoke at a tiny scale:
#       # SPECQ_BENCH_TARGET=t.gguf SPECQ_BENCH_SPECULATOR=s.gguf PY=.venv/bin/python CTX=2048 ... calshadow 512 6
#   SPECQ_SCORE_THREAD=off SPECQ_SPEC_CACHE_SAVE=repeat SLOTS_LIST=8 bash bench/gpu/serve.sh specq 32768 64
#       # A/B: the speculator's scoring on the engine thread between decode batches, as before the score
#       # thread (engine/serving/score_thread.py; default auto = its own thread on a GPU); files carry "-score-off"
#   SPECQ_GROUP_SPARSE=on SPECQ_BENCH_UNION=0.43:8 QUESTIONS=8 SPECQ_SPEC_CACHE_SAVE=repeat SLOTS_LIST=8 bash bench/gpu/serve.sh specq 32768 64
#       # group-sparse prefill in the loop (engine/serving/groups.py; opt-in since 2026-12-05, docs/history.md
#       # "Group-sparse at 30K") with the selections' overlap emulated at the real pair's union (random weights
#       # overlap far less: specq/testing/emulated_selection.py, injected by `specq bench worker --union`, which
#       # runs beside `specq api` instead of `specq up`); files carry "-group-on" / "-union0.43x8"
#   ARRIVAL=per-doc ... bash bench/gpu/serve.sh specq|llama 32768 64   # each document's questions in sequence
#       # (the next sent when the last ended), the documents in parallel; default t0 (all at once); "-perdoc"
#   WORKLOAD=mixed bash bench/gpu/serve.sh specq 65536 64; WORKLOAD=mixed LLAMA_KV_UNIFIED=0 bash bench/gpu/serve.sh llama 65536 64
#       # workloads not tuned to (#50 item 3): JOBS jobs, each its own document of 4096..LEN-LEN/16 tokens drawn
#       # log-uniform (LENGTHS_MIX), 64..512 output tokens drawn uniform (MAX_TOKENS_MIX), Poisson arrivals
#       # (ARRIVAL, default poisson:0.5), all from one seed (SEED, default 0): both servers get the identical job
#       # list. CTX defaults to LEN + LEN/32 (67,584 for 64K; models written for it), SLOTS_LIST to 8; files and
#       # labels carry "-mixed"; the summary's `mixed` object has TTFT p90 and the <8K / 8K-32K / >=32K bands
#
# JSON (and a PNG per stage) go to $OUT. Settings: keep 0.3, 128 output tokens with ignore_eos, all jobs
# sent at t=0 (ARRIVAL), n_batch 4096 / n_ubatch 2048 on both, flash attention on, all layers on the GPU, one
# context of CTX (default 33792) cells per slot (llama-server: -c 8 x CTX --kv-unified, as its users run it).
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-build}; len=${2:-32768}; jobs=${3:-64}
workload=${WORKLOAD:-fixed}
case "$workload" in
fixed) ctx=${CTX:-33792}; arrival=${ARRIVAL:-t0}; mixflags=(); mtag= ;;
mixed)  # one question per document, each job its own lengths (bench/serve.py, specq/bench/workloads.py)
  [ "${QUESTIONS:-1}" = 1 ] && [ "${DOCUMENTS:-0}" = 0 ] || { echo "WORKLOAD=mixed: chat path, QUESTIONS=1 only"; exit 2; }
  ctx=${CTX:-$(( len + len / 32 ))}; arrival=${ARRIVAL:-poisson:0.5}; mtag=-mixed
  mixflags=(--lengths-mix "${LENGTHS_MIX:-4096:$(( len - len / 16 ))}" --max-tokens-mix "${MAX_TOKENS_MIX:-64:512}" --seed "${SEED:-0}")
  SLOTS_LIST=${SLOTS_LIST:-8} ;;
*) echo "WORKLOAD must be fixed or mixed, not $workload"; exit 2 ;;
esac
max_tokens=${MAX_TOKENS:-128}; keep=${KEEP:-0.3}
questions=${QUESTIONS:-1}; mode=${MODE:-specprefill}; docs=$(( jobs / questions ))
qtag=$([ "$questions" = 1 ] || echo "-q$questions")$([ "$mode" = specprefill ] || echo "-$mode")
# the arrival in file names without "-" or ":" (per-doc -> perdoc, poisson:0.5 -> poisson0.5)
atag=$([ "$arrival" = t0 ] || echo "-${arrival//[-:]/}")$mtag
out=${OUT:-/tmp/out}; mkdir -p "$out" /tmp/models
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export LD_PRELOAD=${LD_PRELOAD:-/lib/x86_64-linux-gnu/libstdc++.so.6}   # see ttft.sh
build=/tmp/lcp-build
server=$build/vendor/llama.cpp/bin/llama-server
[ -x "$server" ] || server=$(find "$build" -name llama-server -type f -perm -u+x 2>/dev/null | head -1)
# the document's characters per token for the Qwen2 vocabulary on bench/serve.py's pseudo-code (the
# JSON records the prompt tokens each job really had); documents leave room for template + question
cpt=${CHARS_PER_TOKEN:-2.6}; doc_tokens=$(( len - len / 16 ))
# the models and python: the GPU machine's by default; SPECQ_BENCH_TARGET / SPECQ_BENCH_SPECULATOR (then no
# model is written) and PY (e.g. .venv/bin/python) let the service stages' logic run on a CPU at a tiny scale
target=${SPECQ_BENCH_TARGET:-/tmp/models/7b.gguf}; speculator=${SPECQ_BENCH_SPECULATOR:-/tmp/models/0.5b.gguf}
py=${PY:-python3}

models() {
  [ -n "${SPECQ_BENCH_TARGET:-}" ] && return 0
  # the model's trained context caps both servers' (specq: "up to the model's"; llama-server caps each
  # slot at n_ctx_train): a model written for a smaller CTX is written again (a 128K run after `build`)
  local n=$(( ctx > 32768 ? ctx : 32768 ))
  for s in 0.5b 7b; do
    f=/tmp/models/$s.gguf
    if [ ! -f "$f" ] || [ "$(cat "$f.ctx" 2>/dev/null || echo 0)" -lt "$n" ]; then
      python3 -m specq.cli bench make-model --shape $s --vocab .gpu/ggml-vocab-qwen2.gguf --n-ctx $n --out "$f" || exit 1
      echo "$n" > "$f.ctx"
    fi
  done
}

# The service as the `specq` stage runs it (the `calshadow` stage too): `svc_start SLOTS LOG [NAME=VALUE ...]`
# (further environment for the service) sets $port, $pid and $apid; `svc_stop` ends it. A fresh SPECQ_HOME
# each start (the embedded store and broker: no PostgreSQL/Redis on the device).
svc_start() {
  local slots=$1 log=$2; shift 2
  home=/tmp/specq-home-$slots; rm -rf "$home"; port=$(( 8200 + slots ))
  # CUDA graphs off as production runs them (SPECQ_CUDA_GRAPHS); GRAPHS_ON=1 for the comparison
  svc=(env SPECQ_CUDA_GRAPHS=$([ "${GRAPHS_ON:-0}" = 1 ] && echo true || echo false) SPECQ_HOME=$home SPECQ_API_PORT=$port SPECQ_TARGET=$target SPECQ_SPECULATOR=$speculator
    SPECQ_N_GPU_LAYERS=-1 SPECQ_N_CTX=$ctx SPECQ_SLOTS=$slots SPECQ_N_BATCH=4096 SPECQ_N_UBATCH=2048
    SPECQ_TIME_LIMIT=3000 SPECQ_KV_UNIFIED=${SPECQ_KV_UNIFIED:-false} "$@")
  apid=
  if [ -n "${SPECQ_BENCH_UNION:-}" ]; then
    # the emulated selection overlap is injected by the benchmark's own worker (`specq bench worker
    # --union`, specq/testing/emulated_selection.py); `specq up` and production code never read it
    "${svc[@]}" $py -m specq.cli db upgrade > "$log" 2>&1 || { tail -5 "$log"; exit 1; }
    "${svc[@]}" $py -m specq.cli api --loglevel warning >> "$log" 2>&1 &
    apid=$!
    "${svc[@]}" $py -m specq.cli bench worker --union "$SPECQ_BENCH_UNION" >> "$log" 2>&1 &
  else
    "${svc[@]}" $py -m specq.cli up > "$log" 2>&1 &
  fi
  pid=$!
  for i in $(seq 300); do
    curl -sf localhost:$port/readyz 2>/dev/null | grep -q '"workers_ready":[1-9]' && break; sleep 1
  done
  grep -m3 "warm-up\|ready: target" "$log"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null
}
svc_stop() { kill -TERM $pid $apid; wait $pid $apid; }

case "$stage" in
build)
  t0=$(date +%s)
  if [ ! -x "${server:-/nonexistent}" ]; then
    mkdir -p /tmp/lcp /tmp/site
    tar xzf .gpu/llama-cpp-python-src.tar.gz -C /tmp/lcp
    for p in .gpu/patches/*.patch; do [ -f "$p" ] && { patch -p1 -d /tmp/lcp < "$p" || exit 1; echo "applied $p"; }; done
    # one tree: scikit-build-core's build dir kept at $build, llama.cpp's tools (llama-server) switched on
    ( cd /tmp/lcp && CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90-real -DLLAVA_BUILD=OFF -DLLAMA_BUILD_MTMD=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/site \
        --config-settings=build-dir=$build . ) > /tmp/llama-build.log 2>&1 || { tail -40 /tmp/llama-build.log; exit 1; }
    cmake --build $build --target llama-server -j "$(nproc)" >> /tmp/llama-build.log 2>&1 || { tail -20 /tmp/llama-build.log; exit 1; }
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl
    echo "wheel + llama-server from one tree: $(( $(date +%s) - t0 )) s"
  fi
  server=$(find "$build" -name llama-server -type f -perm -u+x | head -1)
  "$server" --version 2>&1 | head -2
  ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  python3 -c "import llama_cpp, celery, fastapi, sqlalchemy, specq; print('llama_cpp', llama_cpp.__version__, 'gpu', llama_cpp.llama_supports_gpu_offload())" || exit 1
  models
  ;;
specq)
  models
  # a non-default speculator-cache save policy (the worker reads SPECQ_SPEC_CACHE_SAVE) names the files
  # DOCUMENTS=1: the stored-documents path (bench serve --documents); a set SPECQ_CACHE_BYTES names them too
  docflag=$([ "${DOCUMENTS:-0}" = 1 ] && echo --documents)
  ctag=${SPECQ_CACHE_BYTES:+-cache$(( SPECQ_CACHE_BYTES >> 30 ))G}
  # SPECQ_SCORE_THREAD (the worker reads it; default auto = on with a GPU target) set names them too
  # SPECQ_GROUP_SPARSE (off: no group-sparse prefill) and SPECQ_BENCH_UNION (random weights: emulated
  # selection overlap, specq/testing/emulated_selection.py; "0.43:8" names the files "-union0.43x8") too
  utag=${SPECQ_BENCH_UNION:+-union${SPECQ_BENCH_UNION/:/x}}
  # SPECQ_GROUP_HOLD (seconds a delivery may wait for a whole document group's slots) names them too
  htag=${SPECQ_GROUP_HOLD:+-hold$SPECQ_GROUP_HOLD}
  # mode auto's thresholds (SPECQ_AUTO_GROUP_MIN_TOKENS: rule 1a's length, -1 = off; SPECQ_AUTO_QUALITY_MIN_TOKENS:
  # the random-weight shapes have no quality row, so rule 1a runs only with it set) name them too
  autotag=${SPECQ_AUTO_GROUP_MIN_TOKENS:+-agroup$SPECQ_AUTO_GROUP_MIN_TOKENS}${SPECQ_AUTO_QUALITY_MIN_TOKENS:+-aquality$SPECQ_AUTO_QUALITY_MIN_TOKENS}
  # SPECQ_PREFILL_CHUNK (kept prompt tokens per step beside the decode rows; default on a GPU: the batch's room)
  # and SPECQ_SPECULATOR_IMPL (default auto: torch on a GPU) name them too ("-chunkN", "-specllama")
  tag=${SPECQ_SPEC_CACHE_SAVE:+-save-$SPECQ_SPEC_CACHE_SAVE}${SPECQ_PREFILL_CHUNK:+-chunk$SPECQ_PREFILL_CHUNK}${SPECQ_SPECULATOR_IMPL:+-spec$SPECQ_SPECULATOR_IMPL}$htag$autotag${SPECQ_SCORE_THREAD:+-score-$SPECQ_SCORE_THREAD}${SPECQ_GROUP_SPARSE:+-group-$SPECQ_GROUP_SPARSE}$utag$ctag$qtag${docflag:+-docs}$atag
  for slots in ${SLOTS_LIST:-8 1}; do
    log="$out/specq-$slots$tag-$len.log"
    svc_start "$slots" "$log"
    $py -m specq.cli bench serve --url http://127.0.0.1:$port --kind specq --docs "$docs" --questions "$questions" --doc-tokens $doc_tokens \
      --chars-per-token "$cpt" --max-tokens $max_tokens --mode "$mode" --keep $keep --arrival "$arrival" $docflag ${mixflags[@]+"${mixflags[@]}"} --label "specq $slots slots$tag" \
      --out "$out/serve-specq$slots$tag-$len.json" --plot "$out/serve-specq$slots$tag-$len.png"
    svc_stop
  done
  ;;
llama)
  models
  port=8290
  # LLAMA_KV_UNIFIED=0: one KV stream per slot (as specq's slots) instead of one unified cache
  # (the -q tag of llama-server's files: QUESTIONS only; MODE is specq's)
  qtag=$([ "$questions" = 1 ] || echo "-q$questions")$atag
  "$server" -m /tmp/models/7b.gguf -ngl 99 -fa on -np 8 -c $(( 8 * ctx )) $([ "${LLAMA_KV_UNIFIED:-1}" = 1 ] && echo --kv-unified) --cache-ram -1 \
    -b 4096 -ub 2048 --port $port > "$out/llama-server-$len.log" 2>&1 &
  pid=$!
  for i in $(seq 300); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  python3 -m specq.cli bench serve --url http://127.0.0.1:$port --kind llama-server --docs "$docs" --questions "$questions" --doc-tokens $doc_tokens \
    --chars-per-token "$cpt" --max-tokens $max_tokens --arrival "$arrival" ${mixflags[@]+"${mixflags[@]}"} --label "llama-server -np 8$atag" \
    --out "$out/serve-llama${LLAMA_KV_UNIFIED:-1}$qtag-$len.json" --plot "$out/serve-llama${LLAMA_KV_UNIFIED:-1}$qtag-$len.png" \
    $(ls "$out"/serve-specq*$qtag-$len.json 2>/dev/null | sed 's/^/--compare /')
  kill -TERM $pid; wait $pid
  grep -m3 -i "error" "$out/llama-server-$len.log"
  ;;
image)
  # The worker image's own command and environment, outside Docker (no image is built anywhere we can
  # run): the Dockerfile's worker ENV and CMD, compose.yaml's worker command and environment, compose's
  # migrate one-shot, then the API image's CMD in a second process and ONE job through `specq submit
  # --wait` (defaults everywhere: mode auto, the worker's default slots, context, n_batch/n_ubatch,
  # CUDA graphs and warm-up). Differences, and why: no PostgreSQL/Redis on the device (no network, no
  # images), so the store and broker are the embedded defaults; no model pull (no network), so
  # SPECQ_TARGET / SPECQ_SPECULATOR name the random-weight 7B / 0.5B shapes; `python3 -m specq` for the
  # `specq` console script; SPECQ_HOME under /tmp if /var/lib/specq cannot be made.
  models
  home=/var/lib/specq; mkdir -p $home 2>/dev/null && rm -rf $home/* || home=/tmp/var-lib-specq
  mkdir -p $home
  export PYTHONUNBUFFERED=1 SPECQ_HOME=$home SPECQ_MIGRATIONS_DIR=$PWD/migrations NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility SPECQ_QUEUE=specq SPECQ_TIME_LIMIT=1800 SPECQ_GPU=0 \
    SPECQ_SPEC_CACHE_SAVE=repeat SPECQ_TARGET=/tmp/models/7b.gguf SPECQ_SPECULATOR=/tmp/models/0.5b.gguf
  python3 -m specq db upgrade || exit 1                                   # compose: migrate
  python3 -m specq worker --loglevel INFO > "$out/image-worker.log" 2>&1 &  # compose: worker command
  wpid=$!
  python3 -m specq api --host 0.0.0.0 > "$out/image-api.log" 2>&1 &       # Dockerfile: api CMD
  apid=$!
  t0=$(date +%s)
  for i in $(seq 400); do
    curl -sf localhost:8178/readyz 2>/dev/null | grep -q '"workers_ready":[1-9]' && break; sleep 1
  done
  echo "worker ready after $(( $(date +%s) - t0 )) s"; curl -s localhost:8178/readyz; echo
  grep -m5 "warm-up\|ready: target\|slots\|graphs" "$out/image-worker.log"
  python3 -c "from specq.bench.serve import make_document; open('/tmp/image-doc.txt','w').write(make_document(0, $doc_tokens, $cpt))"
  SPECQ_API_URL=http://127.0.0.1:8178 python3 -m specq submit /tmp/image-doc.txt -q "$(python3 -c 'from specq.bench.serve import question_text; print(question_text(0, 0))')" \
    --max-tokens $max_tokens --wait --json > "$out/image-job.json"
  echo "submit rc $?"
  python3 - "$out/image-job.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
r = r.get("result", r)
print("status", r.get("status"), "mode", (r.get("spec") or {}).get("mode"), "reason", (r.get("spec") or {}).get("reason"))
print("timings_ms", json.dumps(r.get("timings_ms")))
print("prompt_tokens", (r.get("usage") or {}).get("prompt_tokens"), "warnings", r.get("warnings"))
PY
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  kill -TERM $apid $wpid; wait $wpid; echo "worker exit $?"
  tail -5 "$out/image-worker.log"
  ;;
calshadow)
  # Issue 48 "Measure", one call (~4-5 min on an H100 after `build`, estimated): `serve.sh calshadow 16384 32`
  # (give LEN and JOBS: the script's defaults, 32768 and 64, are the `specq` stage's).
  # For each shadow rate of RATES ("0 0.05") a fresh start of the service as the `specq` stage runs it (SLOTS,
  # default 8), then `specq bench shadow-cost` (specq/bench/shadow_cost.py): PROBE (3) jobs one after another,
  # then JOBS jobs of LEN - LEN/16 document tokens (mode auto, greedy, MAX_TOKENS 64) at Poisson arrivals; the
  # first rate's run derives the arrival rate (UTILIZATION 0.7 / the probe's median job time) and every later
  # one reuses it, so all send the identical seeded job list (SEED). Mode auto reaches specprefill (and so shadow
  # checks) through SPECQ_AUTO_QUALITY_MIN_TOKENS (default LEN/2): routing only, no evidence row is posted;
  # these runs measure cost, not quality. In the first start, after its run, `specq bench calibrate-service`
  # posts CAL_DOCS (8) documents of CAL_TOKENS (7680) tokens x CAL_Q (2) questions (text lines) to
  # POST /v1/calibrations and waits for the last unit. Files: calibrate-service.json, shadow-rate<R>.json (the
  # first rate's run), shadow-cost.json (0.05 against the first; another rate: shadow-cost-rate<R>.json), logs.
  models
  slots=${SLOTS:-8}; qmin=${SPECQ_AUTO_QUALITY_MIN_TOKENS:-$(( len / 2 ))}
  routing="operator override SPECQ_AUTO_QUALITY_MIN_TOKENS=$qmin (routing only: no evidence row; these runs measure cost, not quality)"
  common=(--jobs "$jobs" --doc-tokens "$doc_tokens" --chars-per-token "$cpt" --max-tokens "${MAX_TOKENS:-64}" --keep "$keep"
    --seed "${SEED:-0}" --utilization "${UTILIZATION:-0.7}" --probe "${PROBE:-3}" --routing "$routing")
  first=
  for r in ${RATES:-0 0.05}; do
    svc_start "$slots" "$out/calshadow-rate$r.log" SPECQ_SHADOW_RATE="$r" SPECQ_AUTO_QUALITY_MIN_TOKENS="$qmin"
    if [ -z "$first" ]; then
      first="$out/shadow-rate$r.json"
      $py -m specq.cli bench shadow-cost --url http://127.0.0.1:$port --shadow-rate "$r" "${common[@]}" --out "$first"
      $py -m specq.cli bench calibrate-service --url http://127.0.0.1:$port --docs "${CAL_DOCS:-8}" --questions "${CAL_Q:-2}" \
        --doc-tokens "${CAL_TOKENS:-7680}" --chars-per-token "$cpt" --max-tokens "${CAL_MAX_TOKENS:-32}" --keep "$keep" \
        --out "$out/calibrate-service.json"
    else
      $py -m specq.cli bench shadow-cost --url http://127.0.0.1:$port --shadow-rate "$r" "${common[@]}" --rate-from "$first" \
        --against "$first" --out "$out/shadow-cost$([ "$r" = 0.05 ] || echo "-rate$r").json"
    fi
    grep -c "shadow check started" "$out/calshadow-rate$r.log"
    svc_stop
  done
  ;;
*) echo "usage: serve.sh build | specq LEN JOBS | llama LEN JOBS | image [LEN] | calshadow LEN JOBS"; exit 2 ;;
esac
