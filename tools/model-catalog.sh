#!/bin/sh
# Prints a markdown table of hub models: family, scheme, download size and the memory each
# needs at 4k and 32k positions with q4 and f16 KV caches, from `kvq-chat --plan` (config.json
# and 8 bytes of each weight file per model; nothing is downloaded but those).
# Usage: sh tools/model-catalog.sh [-b BUILD_DIR] ORG/NAME...   (HF_ENDPOINT, HF_TOKEN apply)
set -eu
build=build
if [ "${1:-}" = "-b" ]; then build=$2; shift 2; fi
[ $# -gt 0 ] || { echo "usage: $0 [-b BUILD_DIR] ORG/NAME..." >&2; exit 2; }
chat=$build/kvq-chat
[ -x "$chat" ] || { echo "$0: $chat not found (build kvq first)" >&2; exit 1; }

# GiB of the "memory at" line of one plan
mem() {
  "$chat" --plan -m "$1" -c "$2" -ctk "$3" -ctv "$3" 2>/dev/null | awk '/^memory at/ { sub(/.*: /, ""); print $1; exit }'
}

echo "| model | architecture | scheme | download | 4k, q4 KV | 4k, f16 KV | 32k, q4 KV | 32k, f16 KV |"
echo "|---|---|---|---|---|---|---|---|"
for name in "$@"; do
  if ! out=$("$chat" --plan -m "$name" -c 4096 -ctk q4 -ctv q4 2>&1); then
    echo "| $name | $(printf '%s' "$out" | tail -n 1 | sed 's/|/\\|/g') | | | | | | |"
    continue
  fi
  arch=$(printf '%s\n' "$out" | awk -F'[(,]' '/^model:/ { print $2; exit }')
  scheme=$(printf '%s\n' "$out" | awk -F', ' '/^model:/ { sub(/\).*/, "", $3); print $3; exit }')
  dl=$(printf '%s\n' "$out" | awk '/^download:/ { print $2, $3; exit }')
  echo "| $name | $arch | $scheme | $dl | $(mem "$name" 4096 q4) GiB | $(mem "$name" 4096 f16) GiB | $(mem "$name" 32768 q4) GiB | $(mem "$name" 32768 f16) GiB |"
done
