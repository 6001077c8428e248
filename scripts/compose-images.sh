#!/usr/bin/env bash
# Local stand-ins for the Docker Hub images that compose.yaml and the Dockerfile name, for a machine
# that cannot reach Docker Hub (this project's development and CI machines; tests/test_compose_up.py).
#
# Why: `docker compose --profile cpu up --build` needs python:3.11-slim-bookworm, redis:7-alpine and
# postgres:16-alpine. Instead of editing compose.yaml or the Dockerfile (they stay what a Docker Hub
# user runs), this builds images under those very names from Debian's packages:
#
#   specq-local/debian:bookworm   debootstrap --variant=minbase bookworm, then `docker import`
#   python:3.11-slim-bookworm     Debian's Python 3.11 in a venv on PATH (`python`, `pip install` work
#                                 as in the official image; Debian's own Python refuses pip: PEP 668)
#   redis:7-alpine                Debian's redis-server 7.0 (protected mode off, as the official image)
#   postgres:16-alpine            Debian's PostgreSQL **15** (bookworm has no 16); its entrypoint honours
#                                 POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB like the official one
#
# Idempotent: an image that exists is kept (SPECQ_IMAGES_REBUILD=1 rebuilds the stand-ins). Run as root
# (debootstrap) with a running Docker engine. The CUDA images (GPU worker) have no stand-in.
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian); HOST_CA_BUNDLE (default
# /etc/ssl/certs/ca-certificates.crt; empty = none): copied into the base image and named by PIP_CERT,
# SSL_CERT_FILE and REQUESTS_CA_BUNDLE, so pip inside the builds trusts what the host trusts (this
# project's machines reach PyPI through a TLS-inspecting proxy whose CA only the host's bundle has).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=specq-local/debian:bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
host_ca=${HOST_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}

have() { docker image inspect "$1" >/dev/null 2>&1; }

if ! have "$base"; then
  command -v debootstrap >/dev/null || { echo "error: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
  start=$(date +%s)
  root=$(mktemp -d /var/tmp/specq-debootstrap.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase bookworm "$root" "$mirror" > "$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; echo "error: debootstrap failed" >&2; exit 1; }
  rm -f "$root.log"
  cat > "$root/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  changes=(--change 'CMD ["bash"]' --change 'ENV LANG=C.UTF-8')
  if [ -s "$host_ca" ]; then
    # this host's trust store, so that pip (PyPI) works from the containers behind the same
    # TLS-inspecting proxy as the host; pip reads PIP_CERT, Python's ssl SSL_CERT_FILE
    mkdir -p "$root/etc/ssl" && cp "$host_ca" "$root/etc/ssl/host-ca-certificates.crt"
    ca=/etc/ssl/host-ca-certificates.crt
    changes+=(--change "ENV PIP_CERT=$ca SSL_CERT_FILE=$ca REQUESTS_CA_BUNDLE=$ca")
  fi
  tar -C "$root" -c . | docker import "${changes[@]}" - "$base" >/dev/null
  rm -rf "$root"; trap - EXIT
  echo "made $base in $(( $(date +%s) - start )) s"
fi

for spec in python:python:3.11-slim-bookworm redis:redis:7-alpine postgres:postgres:16-alpine; do
  name=${spec%%:*}; tag=${spec#*:}
  if have "$tag" && [ -z "${SPECQ_IMAGES_REBUILD:-}" ]; then
    echo "$tag present"; continue
  fi
  start=$(date +%s)
  docker build -q -t "$tag" --build-arg BASE="$base" "$here/compose-images/$name" >/dev/null
  echo "built stand-in $tag in $(( $(date +%s) - start )) s"
done
