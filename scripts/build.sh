#!/usr/bin/env bash
# Configures and builds kforge into ${BUILD_DIR:-build} with Ninja (and ccache when present).
#   scripts/build.sh              # everything: the binaries, the tests, the benches
#   scripts/build.sh TARGET...    # only those (the quick start builds kforge and kforge-sandbox)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} ${CMAKE_ARGS:-}
fi
if [ $# -gt 0 ]; then
  cmake --build "$BUILD_DIR" -j"$(nproc)" --target "$@"
else
  cmake --build "$BUILD_DIR" -j"$(nproc)"
fi
