#!/usr/bin/env bash
# The README's first command: install, build, and optimise the OpenCL matmul example embedded
# (on PoCL when there is no GPU). The argument may be a problem folder or a PyTorch module file
# in KernelBench's format (scripts/quickstart.sh examples/pytorch/rmsnorm.py), imported first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# Only what it runs: the CLI and the sandbox its embedded worker starts (not the tests or services).
scripts/build.sh kforge kforge-sandbox
BUILD_DIR=${BUILD_DIR:-build}
PROBLEM=${1:-examples/opencl/matmul}
if [ -d "$PROBLEM" ]; then "$BUILD_DIR/cli/kforge" validate "$PROBLEM"; fi
if "$BUILD_DIR/cli/kforge" run --help >/dev/null 2>&1; then
  "$BUILD_DIR/cli/kforge" run "$PROBLEM" --budget "${BUDGET:-60}" --out "${OUT:-kforge-out}"
elif "$BUILD_DIR/cli/kforge" eval --help >/dev/null 2>&1; then
  echo "quickstart: 'kforge run' is not built yet; evaluating the seed once instead"
  "$BUILD_DIR/cli/kforge" eval "$PROBLEM"
else
  echo "quickstart: 'kforge run' is not built yet; the problem validated"
fi
