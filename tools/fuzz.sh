#!/bin/sh
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz and runs one.
# usage: tools/fuzz.sh TARGET SECONDS [libFuzzer options...]
#   TARGET: safetensors st_index config tokenizer_load encode decode chat_template server_request session json_schema (or "list")
#   tools/fuzz.sh build: builds every target (and kvq-chat for the session seeds) at once; with
#   KVQ_FUZZ_PREBUILT=1 a TARGET run then skips its build, so several targets can run side by side.
# The growing corpus is kept in build-fuzz/corpus/TARGET; seeds are regenerated
# from the demo model and ../shared into build-fuzz/fuzz-seeds/TARGET. Crashes
# land in build-fuzz/crashes/. CC (default clang-14, then clang) picks the compiler.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
targets="safetensors st_index config tokenizer_load encode decode chat_template server_request session json_schema"
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    echo "usage: tools/fuzz.sh TARGET SECONDS [libFuzzer options...] | build | list  (targets: $targets)"
    exit 0
fi
if [ "$1" = list ]; then echo "$targets"; exit 0; fi
t=$1
build=${KVQ_FUZZ_BUILD:-$root/build-fuzz}
configure() {
    cc=${CC:-$(command -v clang-14 || command -v clang || true)}
    [ -n "$cc" ] || { echo "fuzz.sh: clang not found (install clang-14)" >&2; exit 1; }
    if [ ! -f "$build/CMakeCache.txt" ]; then
        CC=$cc cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" -DKVQ_FUZZ=ON -DKVQ_VULKAN=OFF -DKVQ_BUILD_TESTS=OFF >/dev/null
    fi
}
if [ "$t" = build ]; then
    configure
    # shellcheck disable=SC2046
    cmake --build "$build" -j2 --target $(for x in $targets; do printf 'kvq-fuzz-%s ' "$x"; done) kvq-chat >/dev/null
    exit 0
fi
secs=${2:-60}
shift $(($# >= 2 ? 2 : 1))
case " $targets " in *" $t "*) ;; *) echo "fuzz.sh: unknown target '$t' ($targets)" >&2; exit 1 ;; esac
if [ "${KVQ_FUZZ_PREBUILT:-0}" != 1 ]; then
    configure
    cmake --build "$build" -j2 --target "kvq-fuzz-$t" >/dev/null
    # the session seeds are real files kvq-chat writes (fuzz/make_seeds.sh)
    [ "$t" != session ] || cmake --build "$build" -j2 --target kvq-chat >/dev/null
fi
[ "$t" != session ] || export KVQ_CHAT="$build/kvq-chat"
shared=$(cd "$root/.." && pwd)/shared
sh "$root/fuzz/make_seeds.sh" "$build/fuzz-seeds" "$shared" "$t"
mkdir -p "$build/corpus/$t" "$build/crashes"
# the tokenizer_load inputs are whole tokenizer files: allow them to be large
maxlen=
[ "$t" = tokenizer_load ] && maxlen=-max_len=131072
# a target's dictionary (fuzz/TARGET.dict) when it has one
[ -f "$root/fuzz/$t.dict" ] && maxlen="$maxlen -dict=$root/fuzz/$t.dict"
# ASan defaults plus: report leaks, and keep the run going past the first slow input
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    exec "$build/kvq-fuzz-$t" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$build/crashes/$t-" $maxlen "$@" "$build/corpus/$t" "$build/fuzz-seeds/$t"
