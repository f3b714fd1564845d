#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh needs on a GPU machine that has the NVIDIA driver, nvcc and
# Python but none of our Debian -dev packages: the binaries (stripped) in the build tree's layout
# under .devcarry/build, and every shared library they load that is not glibc under .devcarry/lib.
# Run here after building; then carry .devcarry (it is git-ignored) with the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
scripts/build.sh >/dev/null
C=.devcarry
rm -rf "$C"
mkdir -p "$C/lib"
bins=(cli/kforge services/gpu-worker/kforge-sandbox services/gpu-worker/kforge-gpu-worker
      bench/kforge-bench-compile tests/hostile_kernels_cuda_tests tests/examples_tests tests/hostile_kernels_tests
      tests/benchmark_stage_tests)
for b in "${bins[@]}"; do
  mkdir -p "$C/build/$(dirname "$b")"
  strip --strip-debug -o "$C/build/$b" "$BUILD_DIR/$b"
  ldd "$BUILD_DIR/$b" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libresolv.so*) ;;  # the host's glibc
      libcuda.so*|libnvidia*) ;;                                                          # the host's driver
      *) [ -f "$C/lib/$(basename "$lib")" ] || strip --strip-debug -o "$C/lib/$(basename "$lib")" "$lib" ;;
    esac
  done
done
# OpenCL ICD loader config is not needed there: the GPU check runs the CUDA backend.
du -sh "$C"
