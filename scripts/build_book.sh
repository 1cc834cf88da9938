#!/usr/bin/env bash
# Build the book: scripts/build_book.sh PYTHON [--key]
#
#   PYTHON     the interpreter of the environment (make book passes what setup.sh printed)
#   --key      print the notebook cache key this build would use (and what it is made of),
#              then stop without building
#
# Environment it reads (booleans: 1, true, yes or 0, false, no, any case; anything else is
# a one-line error):
#   PERFLADDER_CONFIG     smoke | full; default: full when a GPU is present, smoke otherwise
#   PERFLADDER_BOOK_OUT   folder that receives _build/ (default: the repository root; a
#                         relative path is taken from the folder the script is called from)
#   PERFLADDER_BOOK_FRESH true: empty the notebook cache first, so every notebook executes in a
#                         fresh kernel in this build (the test suite's build does this)
#   PERFLADDER_BOOK_AHEAD true / false: compile both ladders' expected programs before the
#                         notebooks, side by side (perfladder.ahead.book); unset: when the full
#                         config runs on a GPU, one notebook after the other, and the ladder
#                         notebooks will execute (PERFLADDER_AHEAD_RUNGS: only these rungs')
#   PERFLADDER_BOOK_PARALLEL  true: execute the two ladder notebooks at the same time first, each
#                         on its own GPU and its own physical CPU cores (needs two GPUs; on a
#                         machine without GPUs the cores alone are split), then build
#                         (perfladder.book.execute: an executor that stalls past nbclient's own
#                         bound on its phase plus 60 s is stopped and named, its Python stacks
#                         in <out>/_build/side_by_side/<notebook>.log); false or unset: one
#                         notebook after another
#
# * Runs `jupyter-book build . -W -n --keep-going`: any Sphinx warning, any failing
#   notebook, any broken reference fails the build (non-zero exit).
# * One build at a time per output folder: a second build into the same <out>/_build is
#   refused with a line naming the first one's PID (perfladder.book.lock; the lock of a
#   build that died is free and taken over).
# * Ctrl-C, SIGTERM or SIGHUP stop the whole build -- jupyter-book, the notebook kernels and
#   what they started -- and print one line; the build then counts as failed.
# * Every notebook sees the same PERFLADDER_CONFIG (exported here), the same
#   PERFLADDER_RESULTS_DIR (<out>/_build/results, absolute), where the ladder notebooks
#   write torch.json / jax.json and the comparison page reads them, and PERFLADDER_BUILD_ID
#   (this build's id: the status page shows only what this build did).
# * Executed notebooks are cached (jupyter-cache in <out>/_build/.jupyter_cache). The cache
#   is emptied when its key changed since the last build -- the key (perfladder.book.cache)
#   hashes the library's source and assets, the committed runs under benchmarks/results/
#   (reference.txt included), the framework versions, the config and the device -- or when
#   a ladder's JSON is missing, so cached pages never show numbers of another library,
#   another reference run, another framework version or another machine.
# * The Sphinx environment (<out>/_build/.doctrees) is dropped every time: every page is
#   re-read, so -W sees every warning and the forced pages (status, comparison, H200
#   reference) re-execute; cached notebooks come back from the cache in a second.
# * The previous build's pages move to <out>/_build/html.previous before a build starts
#   (removed when it succeeds): _build/html only ever holds pages this build wrote, and the
#   pages of a failed or interrupted build carry a banner saying so (BUILD-FAILED.txt).
set -euo pipefail
CALLER=$(pwd)
cd "$(dirname "$0")/.."
ROOT=$(pwd)
NAME=scripts/build_book.sh
die() { echo "$NAME: $*" >&2; exit 2; }
[ $# -ge 1 ] && [ -n "$1" ] || die "usage: scripts/build_book.sh PYTHON [--key]"
PY=$1
KEY_ONLY=0
case "${2:-}" in
  "") ;;
  --key) KEY_ONLY=1 ;;
  *) die "unknown option '$2'; valid: --key" ;;
esac

flag() {   # flag VARIABLE: 1 or 0 from its value, or a one-line error naming it
  local value=${!1:-0}
  case "$(printf '%s' "$value" | tr '[:upper:]' '[:lower:]')" in
    1|true|yes) echo 1 ;;
    0|false|no|"") echo 0 ;;
    *) echo "$NAME: $1='$value' is not valid; valid: 1, true, yes, 0, false, no" >&2; return 2 ;;
  esac
}
FRESH=$(flag PERFLADDER_BOOK_FRESH) || exit 2
PARALLEL=$(flag PERFLADDER_BOOK_PARALLEL) || exit 2
AHEAD=auto
[ -n "${PERFLADDER_BOOK_AHEAD:-}" ] && { AHEAD=$(flag PERFLADDER_BOOK_AHEAD) || exit 2; }

case "$PY" in
  /*) ;;
  */*) PY="$ROOT/$PY" ;;                      # relative path (setup.sh prints .venv/bin/python)
  *) PY=$(command -v "$PY") || die "PYTHON '$1' is not on PATH" ;;   # a name on PATH
esac
[ -x "$PY" ] || die "PYTHON '$1' ($PY) is not an executable"
OUT=${PERFLADDER_BOOK_OUT:-$ROOT}
case "$OUT" in
  /*) ;;
  *) OUT="$CALLER/$OUT" ;;                     # relative to where the script was called from
esac
mkdir -p "$OUT" 2>/dev/null || die "PERFLADDER_BOOK_OUT='${PERFLADDER_BOOK_OUT:-}' ($OUT) cannot be created"
OUT=$(cd "$OUT" && pwd)
BUILD="$OUT/_build"
start=$SECONDS

# The venv's bin first on PATH: the notebook kernel and anything it starts use this python.
PATH="$(dirname "$PY"):$PATH"
export PATH

# The quick Python helpers ignore Ctrl-C (the trap below speaks for the whole build); the
# long steps run in their own process group (run_tree), which the trap stops as one tree.
qpy() { ( trap '' INT; exec "$PY" "$@" ); }
CHILD=""
run_tree() {       # perfladder.book.build run: its own process group, stopped as one tree
  "$PY" -m perfladder.book.build run -- "$@" &
  CHILD=$!
  local rc=0
  wait "$CHILD" || rc=$?
  CHILD=""
  return "$rc"
}

# Which ladder configuration, and why (the status page prints the reason).
CFG_LINE=$(qpy -c '
import os, sys
try:
    from perfladder.config import gpu_present, pick_config
except ImportError as e:
    sys.exit(f"scripts/build_book.sh: perfladder cannot be imported with {sys.executable} ({e}); run scripts/setup.sh")
try:
    cfg = pick_config(verbose=False)
except ValueError as e:      # a bad $PERFLADDER_CONFIG: the message names it and the choices
    print(f"scripts/build_book.sh: {e}", file=sys.stderr)
    sys.exit(2)
why = "set by $PERFLADDER_CONFIG" if os.environ.get("PERFLADDER_CONFIG") else (
    "picked by scripts/build_book.sh: " + ("a GPU was found" if gpu_present() else "no GPU was found"))
print(cfg.name + "|" + why)') || exit $?
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

# The notebook cache key: the library's source, the committed runs, the framework versions,
# config and device.
key_args=(--config "$CFG" --device "$DEVICE" --results "$ROOT/benchmarks/results")
KEY=$(qpy -m perfladder.book.cache "${key_args[@]}") || exit $?
if [ "$KEY_ONLY" = 1 ]; then
  qpy -m perfladder.book.cache "${key_args[@]}" --parts
  exit 0
fi

# One build at a time in this output folder: the lock lives as long as any process of the
# build holds descriptor 9 (the script and everything it starts).
mkdir -p "$BUILD"
exec 9<>"$BUILD/.build.lock"
qpy -m perfladder.book.lock 9 "$$" --folder "$BUILD" || exit $?
# A build that ends here, however, leaves a lock file naming nobody; only one that was
# killed outright leaves its PID, for the next build's note.
trap ': > "$BUILD/.build.lock"' EXIT

failed_pages() {   # failed_pages WHY: label what _build/html holds; the words for the last line
  if [ -d "$BUILD/html" ]; then
    qpy -m perfladder.book.build mark-failed "$BUILD/html" "$1" >/dev/null 2>&1 || true
    echo "; the pages in $BUILD/html carry a banner saying so"
  fi
}
on_signal() {      # on_signal NAME STATUS: stop the whole build, say so in one line
  trap '' INT TERM HUP
  if [ -n "$CHILD" ]; then kill -TERM "$CHILD" 2>/dev/null || true; fi
  wait 2>/dev/null || true       # run_tree's helper stops everything below it, then exits
  echo "[book] interrupted ($1) after $((SECONDS - start))s: the build was stopped$(failed_pages "interrupted by $1")" >&2
  exit "$2"
}
trap 'on_signal SIGINT 130' INT
trap 'on_signal SIGTERM 143' TERM
trap 'on_signal SIGHUP 129' HUP

export PERFLADDER_BUILD_ID="$(date -u +%Y-%m-%dT%H:%M:%SZ)-$$"
echo "[book] python:  $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
echo "[book] config:  $CFG ($PERFLADDER_CONFIG_SOURCE)$([ "$CFG" = smoke ] && echo '  (smoke: pages exercise the code; their numbers are NOT performance results)')"
echo "[book] device:  $DEVICE"
echo "[book] output:  $BUILD/html"
echo "[book] results: $PERFLADDER_RESULTS_DIR"
echo "[book] cache key: $KEY"
echo "[book] build:   $PERFLADDER_BUILD_ID"

stamp="$KEY ($CFG|$DEVICE)"
stamp_file="$BUILD/.perfladder-build"
if [ -d "$BUILD/.jupyter_cache" ]; then
  why=""
  if [ "$FRESH" = 1 ]; then
    why="PERFLADDER_BOOK_FRESH=${PERFLADDER_BOOK_FRESH}"
  elif [ "$(cat "$stamp_file" 2>/dev/null || true)" != "$stamp" ]; then
    why="cache key changed: library source, committed runs, framework versions, config or device ($(cat "$stamp_file" 2>/dev/null || echo none) -> $stamp)"
  elif [ ! -f "$PERFLADDER_RESULTS_DIR/torch.json" ] || [ ! -f "$PERFLADDER_RESULTS_DIR/jax.json" ]; then
    why="a ladder's results JSON is missing"
  fi
  if [ -n "$why" ]; then
    echo "[book] emptying the notebook cache: $why"
    rm -rf "$BUILD/.jupyter_cache" "$PERFLADDER_RESULTS_DIR" "$BUILD/side_by_side"
  fi
fi
rm -rf "$BUILD/.doctrees"
rm -f "$BUILD/side_by_side/side_by_side.json"     # an earlier build's; this one writes its own
qpy -m perfladder.book.build set-aside "$BUILD"
mkdir -p "$BUILD" "$PERFLADDER_RESULTS_DIR"
echo "$stamp" > "$stamp_file"

# Compile both ladders' expected programs first, side by side (perfladder.ahead.book): on a
# GPU with the full config, one notebook after the other, when the ladder notebooks will run
# (their results are not cached). PERFLADDER_BOOK_AHEAD=1 / 0 forces it on / off.
if [ "$AHEAD" = auto ]; then
  AHEAD=0
  if [ "$CFG" = full ] && [ "$DEVICE" != cpu ] && [ "$PARALLEL" = 0 ] && \
     { [ ! -f "$PERFLADDER_RESULTS_DIR/torch.json" ] || [ ! -f "$PERFLADDER_RESULTS_DIR/jax.json" ]; }; then
    AHEAD=1
  fi
fi
if [ "$AHEAD" = 1 ]; then
  export PERFLADDER_AHEAD_DIR="$BUILD/ahead"
  export JAX_COMPILATION_CACHE_DIR="$BUILD/ahead/jax-cache"     # the JAX notebook loads from it
  rm -rf "$PERFLADDER_AHEAD_DIR" && mkdir -p "$PERFLADDER_AHEAD_DIR"
  t_ahead=$SECONDS
  run_tree "$PY" -m perfladder.ahead.book run "$PERFLADDER_AHEAD_DIR" ${PERFLADDER_AHEAD_RUNGS:+--rungs "$PERFLADDER_AHEAD_RUNGS"} || true
  echo "[book] compiled ahead in $((SECONDS - t_ahead))s"
fi

if [ "$PARALLEL" = 1 ]; then
  side=()
  [ "$DEVICE" = cpu ] && side=(--no-gpu)
  run_tree "$PY" -m perfladder.book.execute run "$BUILD/.jupyter_cache" "$BUILD/side_by_side" \
      notebooks/01_pytorch_ladder.ipynb notebooks/02_jax_ladder.ipynb "${side[@]}" || {
    echo "[book] FAILED: the ladder notebooks side by side (PERFLADDER_BOOK_PARALLEL=1), after $((SECONDS - start))s" >&2
    exit 1
  }
fi

args=(build "$ROOT" -W -n --keep-going)
[ "$OUT" != "$ROOT" ] && args+=(--path-output "$OUT")
rc=0
# jupyter-book 1.x has no `python -m jupyter_book`; call its click entry point directly.
run_tree "$PY" -c 'import sys; from jupyter_book.cli.main import main; sys.argv[0] = "jupyter-book"; sys.exit(main())' "${args[@]}" || rc=$?
elapsed=$((SECONDS - start))
if [ $rc -ne 0 ]; then
  echo "[book] FAILED (exit $rc) after ${elapsed}s; config $CFG on $DEVICE$(failed_pages "exit $rc")" >&2
  exit $rc
fi
rm -rf "$BUILD/html.previous"
echo "[book] built in ${elapsed}s (config $CFG on $DEVICE): $BUILD/html/index.html"
