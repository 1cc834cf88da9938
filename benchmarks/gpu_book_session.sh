#!/usr/bin/env bash
# Rebuild the book with the full config on a GPU machine, in the background, and gather the evidence.
#
#   benchmarks/gpu_book_session.sh start    # launches the job in its own process session
#   benchmarks/gpu_book_session.sh wait N [DIR]  # waits up to N seconds, reports (and packs
#                                                # what the job has so far into DIR)
#   benchmarks/gpu_book_session.sh collect DIR   # packs logs, results and HTML into DIR
#
# The job: the device probe (matmul and copy ceilings) and `make book` (scripts/setup.sh
# installs the book's wheels from .whl/ offline; build_book.sh picks the full config because a
# GPU is present). With two or more GPUs the build runs the two ladder notebooks side by side,
# one GPU and half the physical cores each (PERFLADDER_BOOK_PARALLEL=1); with one GPU, one
# notebook after another. The GPU-only tests run after the build (GPU_TESTS_S seconds at most,
# default 600: on one H200 they took about nine minutes);
# PRE_TESTS (node ids) run before it, on the idle GPU, and are not run again after. SKIP_TESTS (node ids) are left out of the tests after the
# build (the log's deselected count says how many). AFTER (a command) runs last, on the idle
# GPU, for AFTER_S seconds at most, its output in after.log. It runs detached (setsid), so it
# survives the shell or ssh connection that started it; `wait` can be called again from a
# later one. Everything lands in /tmp/perfladder-job. `start` refuses while a job is still
# running (it would wipe that job's folder and tree); `wait` and `collect` name the job they
# report on.
set -uo pipefail
cd "$(dirname "$0")/.."
JOB=${PERFLADDER_JOB_DIR:-/tmp/perfladder-job}        # overridable for the test suite
TREE=${PERFLADDER_JOB_TREE:-/tmp/perfladder-tree}
running() {   # the PID of a job that is still running, or nothing
  local pid
  pid=$(cat "$JOB/pid" 2>/dev/null) || return 0
  case "$pid" in ''|*[!0-9]*) return 0 ;; esac
  [ -f "$JOB/t1" ] && return 0
  kill -0 "$pid" 2>/dev/null && echo "$pid"
  return 0
}
collect() {   # DIR: pack what the job has so far (logs, results, executed notebooks, HTML) into DIR
  local out=$1; mkdir -p "$out"
  [ -n "$(running)" ] && echo "$0: job $(cat "$JOB/id" 2>/dev/null) is still running: collecting what it has so far" >&2
  cp "$JOB/id" "$out/job_id" 2>/dev/null
  cp "$JOB"/device.json "$JOB"/status "$out"/ 2>/dev/null
  tar czf "$out/evidence.tgz" -C "$JOB" . 2>/dev/null
  [ -d "$TREE/_build/html" ] && tar czf "$out/html.tgz" -C "$TREE/_build" html
  [ -d "$TREE/_build/results" ] && tar czf "$out/results.tgz" -C "$TREE/_build" results jupyter_execute 2>/dev/null
  ls -la "$out"
}
case "${1:-}" in
  start)
    pid=$(running)
    if [ -n "$pid" ]; then
      echo "$0: job $(cat "$JOB/id" 2>/dev/null) (PID $pid) is still running in $JOB; wait for it" \
           "($0 wait SECONDS) or stop it (kill -- -$pid) before starting another" >&2
      exit 3
    fi
    rm -rf "$JOB"; mkdir -p "$JOB"
    date -u +%Y-%m-%dT%H:%M:%SZ > "$JOB/id"
    # Work on a copy: if the checkout is replaced while the build runs (a fresh copy of the
    # repository synced over it), the running notebook kernel loses its working directory.
    rm -rf "$TREE" && cp -a . "$TREE" && cd "$TREE"
    setsid bash -c '
      echo $$ > '"$JOB"'/pid
      export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      date +%s > '"$JOB"'/t0
      timeout 90 python3 benchmarks/device_probe.py --out '"$JOB"'/device.json > '"$JOB"'/probe.log 2>&1
      ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
      unset PYTHONPATH
      # PRE_TESTS: GPU tests (pytest node ids) to run first, on the idle GPU, so that a fault
      # they catch is known before the build has spent its time; the tests after skip them
      deselect=""
      if [ -n "${PRE_TESTS:-}" ]; then
        bash scripts/setup.sh > '"$JOB"'/setup.log 2>&1
        timeout ${PRE_TESTS_S:-400} .venv/bin/python -m pytest -v -p no:cacheprovider --durations=0 $PRE_TESTS > '"$JOB"'/pre_tests.log 2>&1
        echo "pre tests exit $?" >> '"$JOB"'/status
        for t in $PRE_TESTS; do deselect="$deselect --deselect $t"; done
      fi
      for t in ${SKIP_TESTS:-}; do deselect="$deselect --deselect $t"; done
      par=0; [ "$ngpu" -ge 2 ] && par=1
      echo "PERFLADDER_BOOK_PARALLEL=$par PYTHON=python3 make book" > '"$JOB"'/command
      PERFLADDER_BOOK_PARALLEL=$par PYTHON=python3 make book > '"$JOB"'/book.log 2>&1
      echo "book exit $?" >> '"$JOB"'/status
      date +%s > '"$JOB"'/t_book
      cp -r _build/side_by_side '"$JOB"'/ 2>/dev/null
      # the GPU-only tests after the build, never beside a ladder (they would disturb its timing)
      timeout ${GPU_TESTS_S:-600} .venv/bin/python -m pytest -v -m gpu -p no:cacheprovider --durations=0 $deselect tests > '"$JOB"'/gpu_tests.log 2>&1
      echo "gpu tests exit $?" >> '"$JOB"'/status
      if [ -n "${AFTER:-}" ]; then
        echo "$AFTER" > '"$JOB"'/after_command
        timeout ${AFTER_S:-300} bash -c "$AFTER" > '"$JOB"'/after.log 2>&1
        echo "after exit $?" >> '"$JOB"'/status
      fi
      date +%s > '"$JOB"'/t1
    ' > /dev/null 2>&1 < /dev/null &
    [ -f "$JOB/pid" ] || echo $! > "$JOB/pid"   # until the job writes its own PID
    echo "started job $(cat "$JOB/id")"
    ;;
  wait)
    limit=${2:-500}; waited=0
    [ -f "$JOB/id" ] || { echo "$0: no job in $JOB (start one first)" >&2; exit 2; }
    while [ ! -f "$JOB/t1" ] && [ -n "$(running)" ] && [ "$waited" -lt "$limit" ]; do
      sleep 10; waited=$((waited + 10))
    done
    echo "== job $(cat "$JOB/id"): status after ${waited}s =="; cat "$JOB/status" 2>/dev/null
    tail -n 8 "$JOB/after.log" 2>/dev/null; grep -E "PASSED|FAILED|ERROR|passed|failed" "$JOB/pre_tests.log" 2>/dev/null | tail -n 8
    grep -v USDT "$JOB/book.log" 2>/dev/null | tail -n 25
    # the ladder notebooks' own output lands in the notebooks, not in book.log: show the GPUs
    nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader 2>/dev/null
    if [ -f "$JOB/t1" ]; then echo "DONE"
    elif [ -n "$(running)" ]; then echo "RUNNING"
    else echo "STOPPED (the job ended without finishing: see $JOB/book.log)"; fi
    # DIR: pack what the job has so far, so that a wait that is the last call to reach this
    # machine still brings back every file finished by then (a ladder's JSON, the logs)
    if [ -n "${3:-}" ]; then collect "$3" > /dev/null; fi
    ;;
  collect)
    collect "${2:?collect DIR}"
    ;;
  *) echo "usage: $0 start | wait SECONDS [DIR] | collect DIR" >&2; exit 2 ;;
esac
