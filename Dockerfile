# syntax=docker/dockerfile:1
# specq images, one Dockerfile, these targets (compose.yaml builds them):
#
#   api         python:3.11-slim: specq without llama.cpp (the API process never imports it); also runs
#               the one-shot `specq db upgrade` and `specq models pull`
#   worker      a CUDA runtime image with our patched llama-cpp-python built for CUDA by
#               scripts/build-llama.sh (CMAKE_ARGS=-DGGML_CUDA=on), on Python 3.12 in /opt/venv
#   worker-cpu  python:3.11-slim with our patched llama-cpp-python built for the CPU (no NVIDIA needed;
#               `docker compose --profile cpu up`)
#
#   docker build --target api -t specq-api .
#   docker build --target worker --build-arg CUDA_ARCHITECTURES=90 -t specq-worker .   # 90 = H100/H200
#   docker build --target worker-cpu -t specq-worker-cpu .
#
# CUDA_ARCHITECTURES: 80 (A100), 86 (A10/RTX 30), 89 (L4/L40/RTX 40), 90 (H100/H200); several: "80;90".
# CPU_CMAKE_ARGS: the CPU build's llama.cpp flags. Empty (the default) builds for the CPU of the machine
# that builds the image (-march=native: what `docker compose up --build` on the serving host wants);
# for an image that runs elsewhere, e.g. "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON".
#
# Every image runs as the unprivileged user `specq` (uid 10001), which owns /var/lib/specq (SPECQ_HOME:
# the models volume); a volume created from the image takes that owner.

ARG CUDA_VERSION=12.6.3
ARG UBUNTU_VERSION=24.04

# ---------------------------------------------------------------------------------------------- api
FROM python:3.11-slim-bookworm AS api
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SPECQ_HOME=/var/lib/specq SPECQ_MIGRATIONS_DIR=/app/migrations
WORKDIR /app
# layers that change least first: the dependencies follow pyproject.toml only (not README.md)
COPY pyproject.toml ./
# every dependency but llama-cpp-python (the worker image has that, built with CUDA)
RUN python -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb')); \
print('\n'.join(x for x in d['project']['dependencies'] if not x.startswith('llama-cpp-python')))" > /tmp/req.txt \
 && pip install -r /tmp/req.txt
COPY README.md alembic.ini ./
COPY specq ./specq
COPY migrations ./migrations
RUN pip install --no-deps . \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/specq --shell /usr/sbin/nologin specq \
 && mkdir -p /var/lib/specq && chown specq:specq /var/lib/specq
USER specq
EXPOSE 8178
CMD ["specq", "api", "--host", "0.0.0.0"]

# ---------------------------------------------------------------------------------- worker-cpu: build
FROM python:3.11-slim-bookworm AS worker-cpu-build
ARG CPU_CMAKE_ARGS=""
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake git patch ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# layers that change least first, so that an edit of README.md, pyproject.toml or specq/ does not
# rebuild llama.cpp (minutes): the build needs only the patches and the script
COPY patches ./patches
COPY scripts/build-llama.sh ./scripts/build-llama.sh
# optional prebuilt wheels (wheels/: empty in the repository, so a plain checkout compiles): the script
# installs a wheel there only when its version names exactly these patches and build flags, else it
# compiles. scripts/compose-wheel.sh puts the host's own build there (the development and CI machines).
COPY wheels/ /tmp/specq-build/wheels/
# our patched llama-cpp-python, for the CPU (no CUDA flag: the script then builds the .cpu flavour);
# importing it proves the library loads here (a wheel from another glibc would fail now, not at run time)
RUN CMAKE_ARGS="${CPU_CMAKE_ARGS}" PYTHON=/opt/venv/bin/python SPECQ_HOME=/tmp/specq-build \
    bash scripts/build-llama.sh \
 && python -c "import importlib.metadata as m; v = m.version('llama-cpp-python'); print(v); assert v.endswith('.cpu'), v" \
 && python -c "import llama_cpp"
COPY pyproject.toml ./
# the other dependencies (llama-cpp-python's pin is met by the patched build: its local version)
RUN python -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb')); \
print('\n'.join(x for x in d['project']['dependencies'] if not x.startswith('llama-cpp-python')))" > /tmp/req.txt \
 && pip install -r /tmp/req.txt
COPY README.md alembic.ini ./
COPY specq ./specq
COPY migrations ./migrations
RUN pip install .

# ---------------------------------------------------------------------------------------- worker-cpu
FROM python:3.11-slim-bookworm AS worker-cpu
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgomp1 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=worker-cpu-build /opt/venv /opt/venv
COPY --from=worker-cpu-build /app /app
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 SPECQ_HOME=/var/lib/specq SPECQ_MIGRATIONS_DIR=/app/migrations \
    SPECQ_N_GPU_LAYERS=0
WORKDIR /app
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/specq --shell /usr/sbin/nologin specq \
 && mkdir -p /var/lib/specq && chown specq:specq /var/lib/specq
USER specq
STOPSIGNAL SIGTERM
CMD ["specq", "worker"]

# ------------------------------------------------------------------------------------ worker: build
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS worker-build
ARG CUDA_ARCHITECTURES=90
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev build-essential cmake git patch ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY patches ./patches
COPY scripts/build-llama.sh ./scripts/build-llama.sh
# our patched llama-cpp-python, for CUDA; libcuda comes from the driver at run time (the stub links)
RUN CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES} -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined" \
    PYTHON=/opt/venv/bin/python SPECQ_HOME=/tmp/specq-build \
    LIBRARY_PATH=/usr/local/cuda/lib64/stubs \
    bash scripts/build-llama.sh \
 && python -c "import importlib.metadata as m; v = m.version('llama-cpp-python'); print(v); assert v.endswith('.cuda'), v"
COPY specq ./specq
COPY migrations ./migrations
# gpu-scoring: PyTorch, so the score math runs on the GPU where the K cache lies (docs/engine.md) and the
# speculator's windows run in its PyTorch forward (SPECQ_SPECULATOR_IMPL auto; docs/engine.md says
# why); SCORING_EXTRA="" leaves it out (llama.cpp scores, host math: slower, same chunks)
ARG SCORING_EXTRA=gpu-scoring
RUN pip install ".${SCORING_EXTRA:+[$SCORING_EXTRA]}" && mkdir -p /var/lib/specq

# ---------------------------------------------------------------------------------------------- worker
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS worker
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 libgomp1 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=worker-build /opt/venv /opt/venv
COPY --from=worker-build /app /app
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 SPECQ_HOME=/var/lib/specq SPECQ_MIGRATIONS_DIR=/app/migrations \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /app
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/specq --shell /usr/sbin/nologin specq \
 && mkdir -p /var/lib/specq && chown specq:specq /var/lib/specq
USER specq
# Celery's warm shutdown on SIGTERM: the running job finishes (compose gives it stop_grace_period)
STOPSIGNAL SIGTERM
CMD ["specq", "worker"]
