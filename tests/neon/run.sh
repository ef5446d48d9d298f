#!/bin/sh
# Cross-compiles the NEON attention and matmul kernels with the reference and
# small test mains for aarch64 (static) and runs them under qemu-aarch64.
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
SRC="$ROOT/tests/neon/neon_test.c $ROOT/src/ref/ref_kv.c $ROOT/src/cpu/cpu_kv.c $ROOT/src/cpu/attn/attn_scalar.c
     $ROOT/src/cpu/attn/attn_neon.c $ROOT/src/util.c $ROOT/src/cpu/cpu_features.c"
FLAGS="-O2 -static -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Werror -I$ROOT/src -I$ROOT/include"
# Threads when the toolchain has a static libgomp; cpu_kv.c also builds without OpenMP.
# shellcheck disable=SC2086
OMP=1
if ! $CC $FLAGS -fopenmp $SRC -lm -o "$OUT/neon_test" 2>"$OUT/omp.log"; then
    echo "note: no static OpenMP for aarch64, building single-threaded"
    $CC $FLAGS -Wno-unknown-pragmas $SRC -lm -o "$OUT/neon_test"
    OMP=0
fi
"$QEMU" "$OUT/neon_test"
# Matmul kernels: cpu_matmul.c needs OpenMP, so without a static libgomp this part is skipped.
MSRC="$ROOT/tests/neon/neon_matmul_test.c $ROOT/src/ref/ref_weights.c $ROOT/src/cpu/cpu_matmul.c $ROOT/src/cpu/aqlm/aqlm.c
      $ROOT/src/cpu/aqlm/aqlm_neon.c $ROOT/src/cpu/aqlm/aqlm_i8.c $ROOT/src/cpu/aqlm/aqlm_i8_neon.c
      $ROOT/src/cpu/dense/dense_scalar.c $ROOT/src/cpu/dense/dense_neon.c
      $ROOT/src/cpu/i8tile/i8tile.c $ROOT/src/cpu/i8tile/i8tile_neon.c $ROOT/src/util.c
      $ROOT/src/cpu/cpu_features.c"
if [ "$OMP" = 1 ]; then
    # shellcheck disable=SC2086
    $CC $FLAGS -fopenmp $MSRC -lm -o "$OUT/neon_matmul_test" 2>"$OUT/omp_matmul.log" || { cat "$OUT/omp_matmul.log" >&2; exit 1; }
    "$QEMU" "$OUT/neon_matmul_test"
else
    echo "note: NEON matmul kernels not tested (no static libgomp for aarch64)"
fi
