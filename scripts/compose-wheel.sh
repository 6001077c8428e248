#!/usr/bin/env bash
# Put this machine's own build of the patched llama-cpp-python (scripts/setup.sh caches it under
# $SPECQ_HOME/wheels) into wheels/, where the Dockerfile's worker-cpu build stage installs it instead of
# compiling llama.cpp again (tens of minutes on a busy 2-core machine). Used by tests/test_compose_up.py
# (so by .ci/run); a user with no wheel there gets the compile, as before.
#
# A wheel is put there only when it fits the image exactly, so a stale or foreign one is never used:
#   * its version is the one scripts/build-llama.sh would build now: the patches' and build flags' hash
#     and the `.cpu` flavour (a change of patches/ or of the flags makes a new version: no reuse);
#   * CPU_CMAKE_ARGS is empty: the image is built for this machine's CPU, as the host's wheel was
#     (-march=native); with other flags (a portable image) nothing is put there and the stage compiles;
#   * its tags fit the image's Python (cp311 or py3-none) on this architecture (linux_<arch>);
#   * no symbol needs a newer glibc or libstdc++ than Debian bookworm's (2.36, GLIBCXX 3.4.30), which
#     python:3.11-slim-bookworm and its stand-in have (the stage's `import llama_cpp` checks it again).
# Otherwise wheels/ is left empty and the script says why (exit 0: the build then compiles).
# Environment: SPECQ_HOME (default ~/.cache/specq), CPU_CMAKE_ARGS (as compose.yaml passes it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
home=${SPECQ_HOME:-$HOME/.cache/specq}
dest="$root/wheels"
mkdir -p "$dest"
find "$dest" -maxdepth 1 -name '*.whl' -delete  # never leave an older one for the next build

skip() { echo "compose-wheel: no prebuilt wheel for the worker-cpu image ($1): its build compiles llama.cpp"; exit 0; }

[ -z "${CPU_CMAKE_ARGS:-}" ] || skip "CPU_CMAKE_ARGS is set: the host's wheel was built with the default flags"
ver=$(CMAKE_ARGS="" bash "$root/scripts/build-llama.sh" --print-version)
arch=$(uname -m)
wheel=""
for w in "$home"/wheels/llama_cpp_python-"$ver"-*.whl; do
  [ -f "$w" ] || continue
  case "$(basename "$w")" in
    *-cp311-cp311-linux_"$arch".whl|*-py3-none-linux_"$arch".whl|*-py3-none-any.whl) wheel=$w; break ;;
  esac
done
[ -n "$wheel" ] || skip "none of version $ver for cp311/linux_$arch in $home/wheels (scripts/setup.sh builds it)"

why=$(python3 - "$wheel" <<'PY'
import re, sys, zipfile

limits = {"GLIBC": (2, 36), "GLIBCXX": (3, 4, 30)}
worst = {}
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if ".so" not in name.rsplit("/", 1)[-1]:
            continue
        for kind, v in re.findall(rb"\b(GLIBC|GLIBCXX)_(\d+(?:\.\d+)+)\b", z.read(name)):
            kind, v = kind.decode(), tuple(int(x) for x in v.decode().split("."))
            worst[kind] = max(worst.get(kind, v), v)
bad = [f"{k} {'.'.join(map(str, v))} > {'.'.join(map(str, limits[k]))}" for k, v in worst.items() if v > limits[k]]
print("; ".join(bad))
PY
)
[ -z "$why" ] || skip "$(basename "$wheel") needs a newer C library than Debian bookworm's: $why"
ln "$wheel" "$dest/" 2>/dev/null || cp "$wheel" "$dest/"
echo "compose-wheel: $(basename "$wheel") -> wheels/ (the worker-cpu image installs it instead of compiling)"
