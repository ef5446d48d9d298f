#!/bin/sh
# Cross-compiles the NEON attention kernels with the reference and a small
# test main for aarch64 (static) and runs it under qemu-aarch64.
# Usage: tests/neon/run.sh [build-dir]. Exits non-zero on failure; prints
# SKIP and exits 77 (ctest's skip code) only when the cross compiler or qemu is not installed.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-${TMPDIR:-/tmp}/kvq-neon}
CC=${KVQ_AARCH64_CC:-aarch64-linux-gnu-gcc}
QEMU=
for q in qemu-aarch64 qemu-aarch64-static; do
    if command -v "$q" >/dev/null 2>&1; then QEMU=$q; break; fi
done
if ! command -v "$CC" >/dev/null 2>&1 || [ -z "$QEMU" ]; then
    echo "SKIP: $CC or qemu-aarch64 not installed (apt-get install gcc-aarch64-linux-gnu qemu-user)"
    exit 77
fi
mkdir -p "$OUT"
SRC="$ROOT/tests/neon/neon_test.c $ROOT/src/ref/ref_kv.c $ROOT/src/cpu/cpu_kv.c $ROOT/src/cpu/cpu_attn_scalar.c
     $ROOT/src/cpu/cpu_attn_neon.c $ROOT/src/util.c $ROOT/src/cpu/cpu_features.c"
FLAGS="-O2 -static -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Werror -I$ROOT/src -I$ROOT/include"
# Threads when the toolchain has a static libgomp; cpu_kv.c also builds without OpenMP.
# shellcheck disable=SC2086
if ! $CC $FLAGS -fopenmp $SRC -lm -o "$OUT/neon_test" 2>"$OUT/omp.log"; then
    echo "note: no static OpenMP for aarch64, building single-threaded"
    $CC $FLAGS -Wno-unknown-pragmas $SRC -lm -o "$OUT/neon_test"
fi
"$QEMU" "$OUT/neon_test"
