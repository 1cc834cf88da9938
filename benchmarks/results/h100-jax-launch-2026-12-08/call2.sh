# The second call: wait for the detached ladder if it still runs, collect it, then the JAX GPU-only tests.
set -u
T0=$(date +%s)
C=$OUT/call2.txt
bash benchmarks/gpu_run.sh wait ${WAIT_S:-240} | tee $C | cut -c1-200
bash benchmarks/gpu_run.sh collect $OUT/run > /dev/null
left=$(( ${CALL_S:-580} - ($(date +%s) - T0) ))
if [ -f /tmp/perfladder-run/t1 ] && [ $left -gt 120 ]; then
  export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
  echo "python3 -m pytest -m gpu -p no:cacheprovider -q -rs --durations=0 tests/jax tests/kernels tests/multigpu" >> $C
  timeout $left python3 -m pytest -m gpu -p no:cacheprovider -q -rs --durations=0 tests/jax tests/kernels tests/multigpu > $OUT/gpu_tests_jax.log 2>&1
  echo "gpu tests exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
  grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/gpu_tests_jax.log | tail -8
fi
