#!/usr/bin/env bash
# On the GPU machine: build our patched llama-cpp-python with CUDA into /tmp/site (once per machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d .gpu ] || { echo "no .gpu/: run ../shared/gpu/prepare.sh here and carry .gpu"; exit 1; }
bash .gpu/build-on-device.sh
PYTHONPATH=/tmp/site python3 -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__, 'gpu offload', llama_cpp.llama_supports_gpu_offload())"
