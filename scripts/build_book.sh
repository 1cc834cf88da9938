#!/usr/bin/env bash
# Build the book: scripts/build_book.sh PYTHON [--key]
#
#   PYTHON     the interpreter of the environment (make book passes what setup.sh printed)
#   --key      print the notebook cache key this build would use (and what it is made of),
#              then stop without building
#
# Environment it reads:
#   PERFLADDER_CONFIG     smoke | full; default: full when a GPU is present, smoke otherwise
#   PERFLADDER_BOOK_OUT   folder that receives _build/ (default: the repository root)
#   PERFLADDER_BOOK_FRESH 1: empty the notebook cache first, so every notebook executes in a
#                         fresh kernel in this build (the test suite's build does this)
#   PERFLADDER_BOOK_PARALLEL  1: execute the two ladder notebooks at the same time first, each
#                         on its own GPU and its own physical CPU cores (needs two GPUs; on a
#                         machine without GPUs the cores alone are split), then build
#                         (perfladder.book.execute); 0 or unset: one notebook after another
#
# * Runs `jupyter-book build . -W -n --keep-going`: any Sphinx warning, any failing
#   notebook, any broken reference fails the build (non-zero exit).
# * Every notebook sees the same PERFLADDER_CONFIG (exported here) and the same
#   PERFLADDER_RESULTS_DIR (<out>/_build/results, absolute), where the ladder notebooks
#   write torch.json / jax.json and the comparison page reads them.
# * Executed notebooks are cached (jupyter-cache in <out>/_build/.jupyter_cache). The cache
#   is emptied when its key changed since the last build -- the key (perfladder.book.cache)
#   hashes the library's source and assets, the framework versions, the config and the
#   device -- or when a ladder's JSON is missing, so cached pages never show numbers of
#   another library, another framework version or another machine.
# * The Sphinx environment (<out>/_build/.doctrees) is dropped every time: every page is
#   re-read, so -W sees every warning and the forced pages (status, comparison, H200
#   reference) re-execute; cached notebooks come back from the cache in a second.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${1:?usage: scripts/build_book.sh PYTHON [--key]}
KEY_ONLY=0
case "${2:-}" in
  "") ;;
  --key) KEY_ONLY=1 ;;
  *) echo "scripts/build_book.sh: unknown option '$2'; valid: --key" >&2; exit 2 ;;
esac
case "${PERFLADDER_BOOK_PARALLEL:-0}" in
  0|1) ;;
  *) echo "scripts/build_book.sh: PERFLADDER_BOOK_PARALLEL='${PERFLADDER_BOOK_PARALLEL}' is not valid; valid: 0, 1" >&2; exit 2 ;;
esac
case "$PY" in
  /*) ;;
  */*) PY="$ROOT/$PY" ;;                      # relative path (setup.sh prints .venv/bin/python)
  *) PY=$(command -v "$PY") ;;                # a name on PATH
esac
OUT=${PERFLADDER_BOOK_OUT:-$ROOT}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUILD="$OUT/_build"
start=$SECONDS

# The venv's bin first on PATH: the notebook kernel and anything it starts use this python.
PATH="$(dirname "$PY"):$PATH"
export PATH

# Which ladder configuration, and why (the status page prints the reason).
CFG_LINE=$("$PY" -c '
import os
from perfladder.config import gpu_present, pick_config
cfg = pick_config(verbose=False)
why = "set by $PERFLADDER_CONFIG" if os.environ.get("PERFLADDER_CONFIG") else (
    "picked by scripts/build_book.sh: " + ("a GPU was found" if gpu_present() else "no GPU was found"))
print(cfg.name + "|" + why)')
CFG=${CFG_LINE%%|*}
export PERFLADDER_CONFIG=$CFG
export PERFLADDER_CONFIG_SOURCE=${CFG_LINE#*|}
DEVICE=$( (nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true) | head -n 1)
DEVICE=${DEVICE:-cpu}
export PERFLADDER_RESULTS_DIR="$BUILD/results"
export PYTHONUNBUFFERED=1
# Figures must come out as inline images: a non-interactive backend inherited from the
# caller (pytest's conftest sets MPLBACKEND=Agg) would make plt.show() draw nothing.
export MPLBACKEND=module://matplotlib_inline.backend_inline

# The notebook cache key: the library's source, the framework versions, config and device.
KEY=$("$PY" -m perfladder.book.cache --config "$CFG" --device "$DEVICE")
if [ "$KEY_ONLY" = 1 ]; then
  "$PY" -m perfladder.book.cache --config "$CFG" --device "$DEVICE" --parts
  exit 0
fi

echo "[book] python:  $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
echo "[book] config:  $CFG ($PERFLADDER_CONFIG_SOURCE)$([ "$CFG" = smoke ] && echo '  (smoke: pages exercise the code; their numbers are NOT performance results)')"
echo "[book] device:  $DEVICE"
echo "[book] output:  $BUILD/html"
echo "[book] results: $PERFLADDER_RESULTS_DIR"
echo "[book] cache key: $KEY"

stamp="$KEY ($CFG|$DEVICE)"
stamp_file="$BUILD/.perfladder-build"
if [ -d "$BUILD/.jupyter_cache" ]; then
  why=""
  if [ "${PERFLADDER_BOOK_FRESH:-0}" = 1 ]; then
    why="PERFLADDER_BOOK_FRESH=1"
  elif [ "$(cat "$stamp_file" 2>/dev/null || true)" != "$stamp" ]; then
    why="cache key changed: library source, framework versions, config or device ($(cat "$stamp_file" 2>/dev/null || echo none) -> $stamp)"
  elif [ ! -f "$PERFLADDER_RESULTS_DIR/torch.json" ] || [ ! -f "$PERFLADDER_RESULTS_DIR/jax.json" ]; then
    why="a ladder's results JSON is missing"
  fi
  if [ -n "$why" ]; then
    echo "[book] emptying the notebook cache: $why"
    rm -rf "$BUILD/.jupyter_cache" "$PERFLADDER_RESULTS_DIR" "$BUILD/side_by_side"
  fi
fi
rm -rf "$BUILD/.doctrees"
mkdir -p "$BUILD" "$PERFLADDER_RESULTS_DIR"
echo "$stamp" > "$stamp_file"

case "${PERFLADDER_BOOK_PARALLEL:-0}" in
  0) ;;
  1)
    side=()
    [ "$DEVICE" = cpu ] && side=(--no-gpu)
    "$PY" -m perfladder.book.execute run "$BUILD/.jupyter_cache" "$BUILD/side_by_side" \
        notebooks/01_pytorch_ladder.ipynb notebooks/02_jax_ladder.ipynb "${side[@]}" || {
      echo "[book] FAILED: the ladder notebooks side by side (PERFLADDER_BOOK_PARALLEL=1), after $((SECONDS - start))s" >&2
      exit 1
    }
    ;;
esac

args=(build "$ROOT" -W -n --keep-going)
[ "$OUT" != "$ROOT" ] && args+=(--path-output "$OUT")
set +e
# jupyter-book 1.x has no `python -m jupyter_book`; call its click entry point directly.
"$PY" -c 'import sys; from jupyter_book.cli.main import main; sys.argv[0] = "jupyter-book"; sys.exit(main())' "${args[@]}"
rc=$?
set -e
elapsed=$((SECONDS - start))
if [ $rc -ne 0 ]; then
  echo "[book] FAILED (exit $rc) after ${elapsed}s; config $CFG on $DEVICE" >&2
  exit $rc
fi
echo "[book] built in ${elapsed}s (config $CFG on $DEVICE): $BUILD/html/index.html"
