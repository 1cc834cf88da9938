# Issue 46's JAX levers on one GPU: the ladder's chain to B8, then B9-B11 (XLA's cuBLASLt GEMMs,
# GELU's backward with FC1's bias gradient in one Pallas kernel, command buffers for every
# command type), its kernel report and learning check; then the idle time between kernels of
# the fastest configuration and of B11's, traced; then the new GPU-only tests. Run from the
# repository root with OUT set to an empty folder; everything lands there.
set -u
T0=$(date +%s)
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src PYTHONUNBUFFERED=1
C=$OUT/call.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $C
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__)" >> $C 2>&1
JR=${JAX_RUNGS:-R3,B1,B4,B5,B6,B7,B8,B9,B10,B11}
echo "python3 -m perfladder run jax --config full --rungs $JR --out jax_rungs.json" >> $C
timeout ${LADDER_S:-400} python3 -m perfladder run jax --config full --rungs $JR --out $OUT/jax_rungs.json > $OUT/jax.log 2>&1
echo "jax ladder exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
grep -v "^W1\|^I1" $OUT/jax.log | grep -E "^\[|perfladder:" | cut -c1-200 | tail -16
echo "python3 benchmarks/idle_trace_jax.py --config full --from jax_rungs.json --rungs fastest,B11 --out idle_jax.json" >> $C
timeout ${IDLE_S:-90} python3 benchmarks/idle_trace_jax.py --config full --from $OUT/jax_rungs.json --rungs fastest,B11 --out $OUT/idle_jax.json > $OUT/idle.log 2>&1
echo "idle tool exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
tail -25 $OUT/idle.log | cut -c1-200
left=$(( ${CALL_S:-580} - ($(date +%s) - T0) ))
if [ $left -gt 40 ]; then
  echo "python3 -m pytest -v -m gpu -p no:cacheprovider $GPU_TESTS" >> $C
  timeout $left python3 -m pytest -v -m gpu -p no:cacheprovider --durations=0 $GPU_TESTS > $OUT/gpu_tests.log 2>&1
  echo "gpu tests exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
  grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/gpu_tests.log | tail -8
fi
