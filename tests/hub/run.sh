#!/bin/sh
# ctest driver for the hub tests: run.sh BUILD_DIR NAME.test.mjs (in tests/hub).
# Skips (77) when node or tests/server/node_modules (npm ci in tests/server) is missing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
export KVQ_BUILD_DIR="$1"
command -v node >/dev/null 2>&1 || { echo "node not found: skipping"; exit 77; }
[ -d "$here/../server/node_modules/@huggingface/hub" ] || { echo "no tests/server/node_modules (run npm ci in tests/server): skipping"; exit 77; }
cd "$here"
exec node --test --test-reporter=spec "$2"
