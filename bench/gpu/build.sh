#!/usr/bin/env bash
# On the GPU machine: build our patched llama-cpp-python with CUDA into /tmp/site (once per machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d .gpu ] || { echo "no .gpu/: run bench/gpu/prepare.sh on a machine with network and carry .gpu"; exit 1; }
bash .gpu/build-on-device.sh
PYTHONPATH=/tmp/site python3 -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__, 'gpu offload', llama_cpp.llama_supports_gpu_offload())"
# smoke: the whole specprefill path on the GPU with two small random models (seconds)
if [ "${SMOKE:-1}" = 1 ]; then
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  python3 -m specq.cli bench make-model --shape 0.5b --n-layer 2 --out /tmp/smoke-t.gguf
  python3 -m specq.cli bench make-model --shape 0.5b --n-layer 1 --out /tmp/smoke-s.gguf
  python3 -m specq.cli bench ttft --lengths 4096 --reps 1 --target /tmp/smoke-t.gguf --speculator /tmp/smoke-s.gguf
fi
