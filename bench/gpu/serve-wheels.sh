#!/usr/bin/env bash
# Here (with network), before bench/gpu/serve.sh: download the py3.12 manylinux wheels of specq's runtime
# dependencies (the closure of specq's requirements as installed in .venv, exact versions) into .whl/,
# which the GPU calls carry. Packages the device already has are skipped (SKIP, space-separated).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> "$(git rev-parse --git-common-dir)/info/exclude"
skip=${SKIP:-"numpy torch llama-cpp-python llama_cpp_python specq nvidia-* triton setuptools pip"}
.venv/bin/python - "$skip" > /tmp/specq-wheels.txt <<'PY'
import fnmatch, re, sys
from importlib import metadata
skip = sys.argv[1].split()
seen, todo = {}, ["specq"]
while todo:
    name = todo.pop()
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        continue
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    seen[key] = dist.version
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
for key, ver in sorted(seen.items()):
    if not any(fnmatch.fnmatch(key, s) for s in skip):
        print(f"{key}=={ver}")
PY
mkdir -p .whl
while read -r spec; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "$spec" \
    || echo "not found for the device: $spec" >&2
done < /tmp/specq-wheels.txt
du -sh .whl; ls .whl | wc -l
