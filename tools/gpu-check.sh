#!/usr/bin/env bash
# The GPU check in one go (issue 18 §4): build (Release, Vulkan on), run the Vulkan
# tests, then measure on the first GPU and print one summary at the end:
#   device and driver, copy bandwidth, AQLM 2x8 / 1x16 matvecs at 4096x14336 and
#   14336x4096 (ms, share of bandwidth), q8 / q4 attention at 8k, synthetic
#   Llama-2-7B 2x8 and 1x16 decode with all layers and with half of them on the GPU
#   (tok/s, share of the bound, dispatches and barriers per token), the per-op
#   profile of a 7B decode step, and the tuning comparisons (issue 33): the 2x8
#   matvec (mm_lut) at 64 / 256 / 1024 target workgroups with the split reduce fused
#   into the last workgroup and as its own pass, and prompts through the int8 tiles
#   against the f32 tiles (one matmul, and the whole model's prompt tok/s).
# Exits non-zero at the first failure. Meant to finish in under 8 minutes on a GPU
# machine with 16 cores (the synthetic checkpoints take ~5 GB under $TMPDIR).
#
#   tools/gpu-check.sh                 # from the repository root
#   tools/gpu-check.sh --quick         # small shapes and the demo model: checks the script
#                                      # itself on any device (KVQ_VK_DEVICE=llvmpipe for lavapipe)
# BUILD_DIR (default build-gpu) is where it builds; SKIP_BUILD=1 reuses a build there,
# SKIP_TESTS=1 goes straight to the measurements.
set -euo pipefail

quick=0
[ "${1:-}" = "--quick" ] && quick=1
build=${BUILD_DIR:-build-gpu}
jobs=$(nproc 2>/dev/null || echo 4)
summary=$(mktemp)
log=$(mktemp)
trap 'rm -f "$summary" "$log"' EXIT
t0=$(date +%s)

say() { echo "$*" | tee -a "$summary"; }
die() { echo "gpu-check: $*" >&2; exit 1; }
# runs a command, keeping its output in $log; shows the log's end and stops on failure
step() {
    echo "== $*" >&2
    if ! "$@" >"$log" 2>&1; then
        tail -n 60 "$log" >&2
        die "failed: $*"
    fi
}

for tool in cmake glslangValidator; do
    command -v "$tool" >/dev/null || die "$tool not found (packages: cmake glslang-tools)"
done
ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' || [ -n "${LD_LIBRARY_PATH:-}" ] ||
    die "no Vulkan loader (libvulkan.so.1) on this machine"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    step cmake -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVQ_VULKAN=ON
    step cmake --build "$build" -j "$jobs"
fi
bench=$build/kvq-bench
[ -x "$bench" ] || die "$bench was not built"

# The Vulkan tests (on the best device: the GPU when there is one).
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    step ctest --test-dir "$build" -j "$jobs" --output-on-failure -R 'backend_|vulkan|_vk|offload'
    say "vulkan tests: $(grep -Eo '[0-9]+% tests passed.*' "$log" || echo passed)"
fi

if [ $quick = 1 ]; then
    shapes="256x1024 1024x256"
    ctx=1024
    attn=(--ws-mb 8 --shape llama3-8b)
    mb=(--mb 4)
    model=(-m models/demo)
    half=2
else
    shapes="4096x14336 14336x4096"
    ctx=8192
    attn=()
    mb=()
    model=(--synthetic llama2-7b)
    half=16
fi

# Device, driver and copy bandwidth come with the matvec bench.
first=1
for shape in $shapes; do
    r=${shape%x*} c=${shape#*x}
    step "$bench" aqlm --backend vulkan --rows "$r" --cols "$c" -n 0 "${mb[@]}"
    if [ $first = 1 ]; then
        say "device: $(grep -m1 -E '^vulkan:' "$log" || head -n1 "$log")"
        say "$(grep -m1 -E '^device bandwidth' "$log")"
        first=0
    fi
    grep -E '^vk_aqlm ' "$log" | tee -a "$summary"
done

step "$bench" attn --backend vulkan --ctx "$ctx" --reps 3 "${attn[@]}"
say "attention, decode of one token at ctx $ctx (ms per layer and per 32-layer token, share of bandwidth):"
grep -E "^(llama|[a-z0-9-]+) +$ctx " "$log" | tee -a "$summary" || true

for scheme in 2x8 1x16; do
    sch=()
    [ $quick = 1 ] || sch=(--scheme "$scheme")
    for ngl in all "$half"; do
        step "$bench" model "${model[@]}" "${sch[@]}" --backend vulkan -ngl "$ngl" -p 128 -n 32 -ctk q4 -ctv q4
        say "model $scheme -ngl $ngl: $(grep -m1 -o 'plan: .*' "$log" || true)"
        say "  $(grep -E '^decode ' "$log")"
        say "  $(tail -n 1 "$log")"
    done
    [ $quick = 1 ] && break # the demo model has one scheme
done

sch=()
[ $quick = 1 ] || sch=(--scheme 2x8)
step "$bench" model "${model[@]}" "${sch[@]}" --backend vulkan -p 16 -n 8 --profile
say "per-op profile of a decode step (2x8, each command alone):"
sed -n '/^profile of/,/^model:/p' "$log" | grep '^op=' | tee -a "$summary"

# mm_lut's split over workgroups and its reduce (KVQ_VK_TARGET_GROUPS, KVQ_VK_DISABLE=fusedreduce
# in src/vulkan/vk_matmul.c), on the shape with the fewest row blocks (most splits).
set -- $shapes
r=${1%x*} c=${1#*x}
say "mm_lut ${r}x${c} decode by target workgroups and reduce (ms, share of bandwidth):"
for groups in 64 256 1024; do
    for reduce in fused pass; do
        dis=
        [ $reduce = pass ] && dis=fusedreduce
        step env KVQ_VK_TARGET_GROUPS=$groups KVQ_VK_DISABLE=$dis \
            "$bench" aqlm --backend vulkan --rows "$r" --cols "$c" --scheme 2x8 -n 0 "${mb[@]}"
        say "  groups=$groups reduce=$reduce $(grep -m1 -E '^vk_aqlm ' "$log" | grep -Eo 'decode_ms=[^ ]+ bw_ratio=[^ ]+')"
    done
done

# Prompts: the int8 tiles (integer dot products) against the f32 tiles, per matmul (the f32
# tiles forced by KVQ_VK_DISABLE=intdot) and for the whole model (--exact keeps the f32 tiles).
pn=512
[ $quick = 1 ] && pn=128
say "prompt matmul ${r}x${c}, $pn tokens (ms): int8 tiles vs f32 tiles"
for tiles in int8 f32; do
    dis=
    [ $tiles = f32 ] && dis=intdot
    step env KVQ_VK_DISABLE=$dis "$bench" aqlm --backend vulkan --rows "$r" --cols "$c" -n "$pn" --mb 1
    grep -E '^vk_aqlm .*fmt=(2x8|1x16) ' "$log" |
        sed -E "s/^vk_aqlm .*(fmt=[^ ]+) .*(prompt_ms=[^ ]+)$/  tiles=$tiles \1 \2/" | tee -a "$summary"
done
for scheme in 2x8 1x16; do
    sch=()
    [ $quick = 1 ] || sch=(--scheme "$scheme")
    for tiles in int8 f32; do
        ex=()
        [ $tiles = f32 ] && ex=(--exact)
        step "$bench" model "${model[@]}" "${sch[@]}" --backend vulkan -p "$pn" -n 4 --reps 2 "${ex[@]}"
        say "model $scheme prompt $pn tiles=$tiles: $(grep -m1 -Eo 'pp_tps=[^ ]+' "$log")"
    done
    [ $quick = 1 ] && break
done

echo
echo "==== kvq GPU check summary ($(( $(date +%s) - t0 )) s) ===="
cat "$summary"
