#!/bin/sh
# The include-and-call graph of src/cpu/ and src/vulkan/ has no circle (docs/layout.md).
# usage: layout_cycles.sh SRC_DIR OBJ_DIR   (OBJ_DIR: the kvq library's objects, .../kvq.dir/src)
#
# Nodes are source files named without their extension; a header with a .c of the same name
# beside it is that file (vk_weights.h is vk_weights), any other header is a node of its own
# (a contract both sides include). Edges: a calls a function b defines (from the objects'
# symbol tables, so calls through macros and inline helpers count where they land), or a
# includes b. In src/cpu/ the kernel rooms (aqlm/, attn/, dense/, i8tile/) are also checked as
# single nodes: a room never calls or includes the dispatcher above it, nor a room that uses it.
# tsort names the loop when there is one.
set -eu
SRC=$1
OBJ=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# node PATH: the graph node of a source path relative to SRC
node() {
    case $1 in
    *.h) [ -f "$SRC/${1%.h}.c" ] && echo "${1%.h}" || echo "$1" ;;
    *.c) echo "${1%.c}" ;;
    *) echo "$1" ;;
    esac
}

check() { # check NAME EDGEFILE
    if ! tsort "$2" >/dev/null 2>"$tmp/tsort.err"; then
        echo "FAIL: $1 has a circle:" >&2
        sed 's/^tsort: //' "$tmp/tsort.err" >&2
        fail=1
    else
        echo "ok: $1 ($(wc -l <"$2") edges, no circle)"
    fi
}

for dir in cpu vulkan; do
    [ -d "$SRC/$dir" ] || continue
    : >"$tmp/def"
    : >"$tmp/use"
    : >"$tmp/edges"
    files=$(cd "$SRC" && find "$dir" -type f \( -name '*.c' -o -name '*.h' -o -name '*.inc' \) | sort)
    for f in $files; do
        n=$(node "$f")
        echo "$n $n" >>"$tmp/edges" # every file is a node, even one with no edges
        # includes that stay inside this directory
        sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$SRC/$f" | while read -r inc; do
            case $inc in "$dir"/*) [ -f "$SRC/$inc" ] && echo "$n $(node "$inc")" ;; esac
        done >>"$tmp/edges"
        case $f in *.c) ;; *) continue ;; esac
        o="$OBJ/$f.o"
        # a file the build leaves out on this architecture (_neon.c on x86) has no object
        [ -f "$o" ] || continue
        nm "$o" | awk -v n="$n" 'NF == 3 && $2 ~ /^[TDBRV]$/ {print $3, n}' >>"$tmp/def"
        nm -u "$o" | awk -v n="$n" '{print $NF, n}' >>"$tmp/use"
    done
    if [ ! -s "$tmp/def" ] && [ "$dir" = vulkan ]; then
        echo "skip: src/vulkan is not built (no Vulkan SDK)"
        continue
    fi
    if [ ! -s "$tmp/def" ]; then
        echo "FAIL: no objects for src/$dir under $OBJ" >&2
        fail=1
        continue
    fi
    sort -u "$tmp/def" >"$tmp/d"
    sort -u "$tmp/use" >"$tmp/u"
    join "$tmp/u" "$tmp/d" | awk '{print $2, $3}' >>"$tmp/edges"
    awk '$1 != $2' "$tmp/edges" | sort -u >"$tmp/files"
    awk '$1 == $2' "$tmp/edges" | sort -u >>"$tmp/files"
    check "src/$dir (files)" "$tmp/files"
    if [ "$dir" = cpu ]; then
        # rooms: cpu/aqlm/aqlm_avx2 -> cpu/aqlm; top-level files stay themselves
        awk '{
            for (i = 1; i <= 2; i++) { n = split($i, p, "/"); $i = n > 2 ? p[1] "/" p[2] : $i }
            print $1, $2
        }' "$tmp/files" | sort -u >"$tmp/rooms"
        check "src/cpu (rooms)" "$tmp/rooms"
    fi
done
exit $fail
