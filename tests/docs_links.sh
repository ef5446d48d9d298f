#!/bin/sh
# Checks the relative links of the documentation: README.md, docs/*.md and src/vulkan/README.md.
# Every [text](target) outside code must name a file that exists; a #anchor (same file or another
# .md file) must match the GitHub-style slug of a heading there. http(s)/mailto links are not
# fetched. README.md must stay under 300 lines, so that it stays an entry point.
# Usage: sh tests/docs_links.sh [SOURCE_DIR]   (POSIX sh and awk; exit 1 on the first report)
set -u
root=${1:-.}
cd "$root" || { echo "docs_links: cannot enter $root"; exit 1; }

fail=0
report() { echo "docs_links: $*"; fail=1; }

files="README.md"
for f in docs/*.md src/vulkan/README.md; do
  [ -f "$f" ] && files="$files $f"
done

# One line per link: the link target, as written. Fenced code blocks are skipped and inline code
# spans removed first, so option lists like `[-b N] (...)` are not taken for links.
links_of() {
  awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    {
      line = $0
      gsub(/`[^`]*`/, "", line)
      if (match(line, /^[ ]*\[[^]]+\]:[ ]+[^ ]+/)) {      # reference definition [x]: target
        t = substr(line, RSTART, RLENGTH); sub(/^[ ]*\[[^]]+\]:[ ]+/, "", t); print t
        next
      }
      while (match(line, /\]\([^)]*\)/)) {
        t = substr(line, RSTART + 2, RLENGTH - 3)
        sub(/^[ ]+/, "", t); sub(/[ ].*$/, "", t)            # drop a "title"
        sub(/^</, "", t); sub(/>$/, "", t)
        print t
        line = substr(line, RSTART + RLENGTH)
      }
    }' "$1"
}

# One line per heading: its anchor as GitHub makes it (lowercase; ASCII punctuation other than
# "-" and "_" removed, and the non-ASCII punctuation these docs use; spaces to "-"; a repeated slug
# gets -1, -2, ...). Other non-ASCII characters are kept, as GitHub keeps letters.
slugs_of() {
  awk '
    BEGIN { punct = "!\"#$%&'\''()*+,./:;<=>?@[\\]^`{|}~" }
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    /^#+[ \t]/ {
      h = $0
      sub(/^#+[ \t]+/, "", h); sub(/[ \t]+#+[ \t]*$/, "", h); sub(/[ \t]+$/, "", h)
      h = tolower(h)
      gsub(/—|–|×|·|…|→|≤|≥|‖|½/, "", h)
      s = ""
      for (i = 1; i <= length(h); i++) {
        c = substr(h, i, 1)
        if (c == " ") s = s "-"
        else if (index(punct, c) == 0) s = s c
      }
      if (s in seen) print s "-" (++seen[s]); else { seen[s] = 0; print s }
    }' "$1"
}

for f in $files; do
  dir=$(dirname "$f")
  links_of "$f" > "${TMPDIR:-/tmp}/docs_links.$$" || { report "cannot read $f"; continue; }
  while IFS= read -r t; do
    case $t in
      http://*|https://*|mailto:*) continue ;;
    esac
    path=${t%%#*}
    anchor=
    case $t in *'#'*) anchor=${t#*#} ;; esac
    if [ -z "$path" ]; then
      target=$f
    else
      target=$dir/$path
      if [ ! -e "$target" ]; then
        report "$f: link ($t): $target does not exist"
        continue
      fi
    fi
    if [ -n "$anchor" ]; then
      case $target in
        *.md) ;;
        *) report "$f: link ($t): an anchor into $target, which is not Markdown"; continue ;;
      esac
      if ! slugs_of "$target" | grep -qxF -- "$anchor"; then
        report "$f: link ($t): no heading in $target has the anchor #$anchor"
      fi
    fi
  done < "${TMPDIR:-/tmp}/docs_links.$$"
  rm -f "${TMPDIR:-/tmp}/docs_links.$$"
done

n=$(wc -l < README.md)
if [ "$n" -ge 300 ]; then
  report "README.md has $n lines; keep it under 300 (move the detail into docs/)"
fi

[ "$fail" -eq 0 ] && echo "docs_links: ok ($(echo $files | wc -w) files, README.md $n lines)"
exit $fail
