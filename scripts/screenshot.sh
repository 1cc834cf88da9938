#!/usr/bin/env bash
# Screenshot built book pages with headless Chromium (Debian: apt-get install chromium),
# to look at them as a reader would.
#
#   scripts/screenshot.sh OUTDIR [PAGE ...]
#
# PAGE is a path under _build/html without .html (default: every page of the book).
# Writes OUTDIR/<page with / replaced by _>.png, 1280 px wide and 2400 px tall.
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:?usage: scripts/screenshot.sh OUTDIR [PAGE ...]}
shift
HTML=${PERFLADDER_BOOK_HTML:-_build/html}
BROWSER=$(command -v chromium || command -v chromium-browser || true)
[ -n "$BROWSER" ] || { echo "no chromium found (apt-get install chromium)" >&2; exit 2; }
pages=("$@")
if [ ${#pages[@]} -eq 0 ]; then
  pages=(chapter13/index chapter13/case_study notebooks/01_pytorch_ladder notebooks/02_jax_ladder
         notebooks/03_comparison notebooks/04_h200_reference chapter13/exercises notebooks/00_status)
fi
mkdir -p "$OUTDIR"
for page in "${pages[@]}"; do
  case "$HTML" in /*) file="$HTML/$page.html" ;; *) file="$(pwd)/$HTML/$page.html" ;; esac
  [ -f "$file" ] || { echo "missing: $file" >&2; exit 1; }
  png="$OUTDIR/${page//\//_}.png"
  profile=$(mktemp -d)
  "$BROWSER" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --hide-scrollbars --user-data-dir="$profile" --window-size="${WIDTH:-1280},${HEIGHT:-2400}" \
    --screenshot="$png" "file://$file" >/dev/null 2>&1
  rm -rf "$profile"
  echo "$png"
done
