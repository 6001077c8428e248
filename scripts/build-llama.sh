#!/usr/bin/env bash
# Build and install specq's patched llama-cpp-python into the current Python.
#
# Why: stock llama.cpp refuses a batch whose positions have gaps, and SpecPrefill's sparse prefill
# keeps the original position ids of the tokens it keeps. patches/*.patch (unified diffs against the
# llama-cpp-python source root, applied in order) add per-context setters: position jumps (0001), the
# eval callback (0002), a stop flag and deadline read in C by the abort callback (0003). The result is versioned 0.3.36+specq.<patch hash>
# (a PEP 440 local version, so the project's ==0.3.36 pin is still satisfied) and its wheel is cached
# under $SPECQ_HOME/wheels: a second run with the same patches installs in seconds.
#
# Usage: scripts/build-llama.sh            CPU build (about 6 minutes on 2 cores, once)
#        CMAKE_ARGS="-DGGML_CUDA=on" scripts/build-llama.sh     CUDA build
#        scripts/build-llama.sh --print-version   the local version it would install (nothing else;
#                                                 scripts/compose-wheel.sh picks the cached wheel by it)
# Environment: PYTHON (default: python3 on PATH), SPECQ_HOME (default ~/.cache/specq).
set -euo pipefail
ver=0.3.36
py=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
home=${SPECQ_HOME:-$HOME/.cache/specq}
flavour=cpu
case "${CMAKE_ARGS:-}" in *GGML_CUDA=on*|*GGML_CUDA=ON*) flavour=cuda ;; esac
# No AMX kernels: with -march=native on a CPU that has AMX (Sapphire Rapids and later, such as this
# project's CI machines) ggml repacks Q4_K weights into AMX buffers, and ggml_backend_amx_mul_mat
# then segfaults in the speculator's first scoring decode (llama.cpp issue #20824, unfixed in this
# release). gcc keeps an explicit -mno-* even when -march=native comes later on the command line.
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
build_flags="-DCMAKE_C_FLAGS=$no_amx|-DCMAKE_CXX_FLAGS=$no_amx"
# the wheel's version names the patches and these build flags, so a cached wheel built otherwise is not reused
hash=$( { cat "$root"/patches/*.patch; echo "$build_flags"; } | sha256sum | cut -c1-10)
local_ver="$ver+specq.$hash.$flavour"
if [ "${1:-}" = "--print-version" ]; then echo "$local_ver"; exit 0; fi

installed=$("$py" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null || true)
if [ "$installed" = "$local_ver" ]; then
  echo "llama-cpp-python $local_ver already installed"; exit 0
fi

wheels="$home/wheels"; mkdir -p "$wheels"
wheel=$(ls "$wheels"/llama_cpp_python-"$local_ver"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  echo "building llama-cpp-python $local_ver (patched; one time, several minutes)"
  start=$(date +%s)
  "$py" -m pip install -q "scikit-build-core[pyproject]>=0.9.2" 2>&1 | grep -v WARNING || true
  src="$home/src"; mkdir -p "$src"
  tarball="$src/llama_cpp_python-$ver.tar.gz"
  if [ ! -f "$tarball" ]; then
    "$py" -m pip download -q --no-deps --no-binary :all: --no-build-isolation "llama-cpp-python==$ver" -d "$src" 2>&1 | grep -v WARNING || true
  fi
  [ -f "$tarball" ] || { echo "error: could not download llama-cpp-python $ver source with pip" >&2; exit 1; }
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  tar xzf "$tarball" -C "$work"
  tree="$work/llama_cpp_python-$ver"
  for p in "$root"/patches/*.patch; do
    patch -p1 -s -d "$tree" < "$p" || { echo "error: patch $p does not apply" >&2; exit 1; }
    echo "applied $(basename "$p")"
  done
  sed -i "s/^__version__ = \"$ver\"/__version__ = \"$local_ver\"/" "$tree/llama_cpp/__init__.py"
  grep -q "__version__ = \"$local_ver\"" "$tree/llama_cpp/__init__.py" || { echo "error: could not set the version" >&2; exit 1; }
  CMAKE_ARGS="${CMAKE_ARGS:-} \"-DCMAKE_C_FLAGS=$no_amx\" \"-DCMAKE_CXX_FLAGS=$no_amx\" -DLLAVA_BUILD=OFF -DLLAMA_BUILD_MTMD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$wheels" "$tree" > "$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; echo "error: llama-cpp-python build failed" >&2; exit 1; }
  wheel=$(ls "$wheels"/llama_cpp_python-"$local_ver"-*.whl | head -1)
  echo "built $(basename "$wheel") in $(( $(date +%s) - start )) s"
fi
"$py" -m pip install -q --no-deps --force-reinstall "$wheel" 2>&1 | grep -v WARNING || true
# llama-cpp-python's own runtime needs (pure Python)
"$py" -m pip install -q "typing-extensions>=4.5.0" "numpy>=1.20.0" "diskcache>=5.6.1" "jinja2>=2.11.3" 2>&1 | grep -v WARNING || true
echo "installed llama-cpp-python $local_ver"
