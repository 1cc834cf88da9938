#!/usr/bin/env bash
# Both full ladders on a machine with two GPUs, and the committed-results layout.
#
#   benchmarks/gpu_run.sh start OUT   # detached: survives the shell that started it
#   benchmarks/gpu_run.sh wait N      # waits up to N seconds, then reports
#   benchmarks/gpu_run.sh collect DIR # results JSON, waterfalls, status and the logs into DIR
#
# 1. the device probe (matmul and copy ceilings: device.json);
# 2. the single-GPU rungs of both ladders at once, PyTorch on GPU 0 and JAX on GPU 1, each
#    with its kernel report and learning check (torch.json, jax.json, waterfall PNGs);
# 3. the multi-GPU rungs of both ladders, one framework after the other, with both GPUs free:
#    `perfladder run --resume` continues each ladder from its file (the prediction is printed
#    before every launch).
# With one GPU, step 2 runs the ladders one after the other and step 3 predicts only.
# Environment: PYTHON (default python3), CONFIG (default full; smoke runs it all on a CPU),
# FRAMEWORKS (default "torch jax": which ladders, in that order; one alone takes about half the time).
set -uo pipefail
cd "$(dirname "$0")/.."
JOB=/tmp/perfladder-run
case "${1:-}" in
  start)
    OUT=${2:?start OUT}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
    export PY=${PYTHON:-python3} CONFIG=${CONFIG:-full} FRAMEWORKS=${FRAMEWORKS:-torch jax}
    seen=" "
    for fw in $FRAMEWORKS; do
      case "$fw" in torch|jax) ;; *) echo "gpu_run.sh: FRAMEWORKS names '$fw'; valid: torch, jax" >&2; exit 2 ;; esac
      case "$seen" in *" $fw "*) echo "gpu_run.sh: FRAMEWORKS names '$fw' twice; valid: torch, jax, each once" >&2; exit 2 ;; esac
      seen="$seen$fw "
    done
    [ "$seen" != " " ] || { echo "gpu_run.sh: FRAMEWORKS is empty; valid: torch, jax" >&2; exit 2; }
    rm -rf "$JOB"; mkdir -p "$JOB"; echo "$OUT" > "$JOB/out"
    # perfladder's own packages (jsonschema writes the results) named now, not after the
    # compiles and the first rung in a detached job's log
    PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} "$PY" -c 'import sys
from perfladder.run_checks import CLIError, check_packages
try:
    check_packages()
except CLIError as e:
    sys.exit(f"gpu_run.sh: {e}")' || exit 2
    # run from a copy: a checkout replaced while the job runs would pull the code from under it
    rm -rf /tmp/perfladder-tree && cp -a . /tmp/perfladder-tree && cd /tmp/perfladder-tree
    setsid bash -c '
      OUT=$(cat '"$JOB"'/out)
      export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      date +%s > '"$JOB"'/t0
      timeout 120 "$PY" benchmarks/device_probe.py --out "$OUT/device.json" > "$OUT/probe.log" 2>&1
      single() { "$PY" -c "import perfladder.$1 as f; print(\",\".join(n for n, r in f.RUNGS.items() if r.stage != \"multi-gpu\" and not r.optional))"; }
      multi() { "$PY" -c "import perfladder.$1 as f; print(\",\".join(n for n, r in f.RUNGS.items() if r.stage == \"multi-gpu\"))"; }
      ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
      run1() {   # framework, gpu
        CUDA_VISIBLE_DEVICES=$2 "$PY" -m perfladder run "$1" --config "$CONFIG" --rungs "$(single "$1")" \
          --out "$OUT/$1.json" --png "$OUT/$1_waterfall.png" > "$OUT/$1.log" 2>&1
        echo "$1 single-GPU rungs exit $?" >> '"$JOB"'/status
      }
      set -- $FRAMEWORKS
      if [ "$ngpu" -ge 2 ] && [ $# -eq 2 ]; then run1 "$1" 0 & run1 "$2" 1 & wait
      else for fw in "$@"; do run1 "$fw" 0; done; fi
      for fw in "$@"; do
        "$PY" -m perfladder run $fw --config "$CONFIG" --resume "$OUT/$fw.json" --rungs "$(multi $fw)" \
          --no-learn --out "$OUT/$fw.json" --png "$OUT/${fw}_waterfall.png" > "$OUT/${fw}_multi.log" 2>&1
        echo "$fw multi-GPU rungs exit $?" >> '"$JOB"'/status
      done
      date +%s > '"$JOB"'/t1
    ' > /dev/null 2>&1 < /dev/null &
    echo "started"
    ;;
  wait)
    limit=${2:-500}; waited=0
    while [ ! -f "$JOB/t1" ] && [ "$waited" -lt "$limit" ]; do sleep 5; waited=$((waited + 5)); done
    OUT=$(cat "$JOB/out"); echo "== after ${waited}s =="; cat "$JOB/status" 2>/dev/null
    for f in "$OUT"/*.log; do echo "--- $f"; grep -v USDT "$f" | tail -n 4; done
    [ -f "$JOB/t1" ] && echo "DONE" || echo "RUNNING"
    ;;
  collect)   # DIR: the results, the PNGs and one archive of the logs (few files to copy)
    dst=${2:?collect DIR}; OUT=$(cat "$JOB/out"); mkdir -p "$dst"
    cp "$OUT"/*.json "$OUT"/*.png "$JOB"/status "$dst"/ 2>/dev/null
    tar czf "$dst/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) 2>/dev/null
    ls -la "$dst"
    ;;
  *) echo "usage: $0 start OUT | wait SECONDS | collect DIR" >&2; exit 2 ;;
esac
