#!/bin/sh
# ctest driver for the kvq-server Node tests: run.sh BINARY MODEL_DIR BUILD_DIR NAME.test.mjs (in tests/server)
# Skips (77) when node or tests/server/node_modules (npm ci) is missing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
export KVQ_SERVER="$1" KVQ_MODEL="$2" KVQ_BUILD_DIR="$3"
command -v node >/dev/null 2>&1 || { echo "node not found: skipping"; exit 77; }
[ -d "$here/node_modules/openai" ] || { echo "no $here/node_modules (run npm ci in tests/server): skipping"; exit 77; }
cd "$here"
exec node --test --test-reporter=spec "$(basename "$4")"
