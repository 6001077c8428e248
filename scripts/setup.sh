#!/usr/bin/env bash
# Set up specq in ./.venv: our patched llama-cpp-python (built once, then cached), specq and its
# test tools. Safe to run again. Environment: PYTHON (default python3), CMAKE_ARGS (e.g.
# "-DGGML_CUDA=on" for a CUDA build), SPECQ_HOME (default ~/.cache/specq).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v WARNING || true
PYTHON=.venv/bin/python scripts/build-llama.sh
.venv/bin/python -m pip install -q -e ".[dev]" 2>&1 | grep -v WARNING || true
.venv/bin/python -c "import llama_cpp, specq; print('specq ready: llama-cpp-python', llama_cpp.__version__)"
