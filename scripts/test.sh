#!/usr/bin/env bash
# The README's test command: install, build, run every test (unit and integration).
# Integration tests start their own redis-server / PostgreSQL / Prometheus on free loopback ports
# in temporary folders and stop them afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)" --timeout 600 "$@"
