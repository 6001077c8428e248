#!/usr/bin/env bash
# Prepare a folder to carry to the GPU machine: a trimmed llama-cpp-python source (CUDA build happens
# on the GPU machine, which has nvcc, cmake, ninja and scikit-build-core but no network) plus the
# pure-Python wheels it lacks. Run from the project root: bash bench/gpu/prepare.sh [LLAMA_CPP_PYTHON_VERSION]
set -euo pipefail
ver="${1:-0.3.36}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(git rev-parse --show-toplevel)"
dest="$root/.gpu"
# .gpu/ is in .gitignore; the exclude line covers older checkouts (a worktree's .git is a file)
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
mkdir -p "$dest"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$tmp" 2>&1 | grep -v WARNING || true
tar xzf "$tmp"/llama_cpp_python-"$ver".tar.gz -C "$tmp"
src="$tmp/llama_cpp_python-$ver"
v="$src/vendor/llama.cpp"
cp "$v/models/ggml-vocab-qwen2.gguf" "$dest/" 2>/dev/null || true   # real Qwen2 tokenizer, vocab only
rm -rf "$src/.git" "$src/examples" "$v/models" "$v/docs" "$v/media" "$v/benches" "$v/tests" "$v/tools/ui/src"
tar czf "$dest/llama-cpp-python-src.tar.gz" -C "$src" .
# pure-Python packages the GPU machine lacks
python3 -m pip download -q --no-deps -d "$dest/wheels" diskcache==5.6.3 gguf==0.19.0 2>&1 | grep -v WARNING || true
rm -rf "$dest/patches"; mkdir -p "$dest/patches"
# the project's own llama.cpp patches (unified diffs against the llama-cpp-python source root)
cp "$root"/patches/*.patch "$dest/patches/" 2>/dev/null || true
cp "$here/build-on-device.sh" "$dest/"
chmod +x "$dest/build-on-device.sh"
du -sh "$dest"
cat <<MSG
Ready. On the GPU machine, carry .gpu and start the command with:
  bash .gpu/build-on-device.sh && export PYTHONPATH=/tmp/site:\$PYTHONPATH
The build takes ~5 minutes; then call again within 30 s (the machine stays warm and keeps /tmp/site).
MSG
