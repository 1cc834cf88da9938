# Issue 46's B12 (the QKV bias inside the attention kernels) on one GPU in one call: the JAX
# ladder's chain to B8, B10 and B12, with its kernel report and learning check; then the JAX
# fused-attention GPU-only tests (B12's bias at the model's full shape). Run from the
# repository root with OUT set to an empty folder; everything lands there.
set -u
T0=$(date +%s)
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --find-links .whl-nv --no-compile --no-cache-dir jsonschema > /dev/null 2>&1
C=$OUT/call.txt
git log -1 --format=%H > $OUT/commit.txt 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $C
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__)" >> $C 2>&1
JR=${JAX_RUNGS:-R3,B1,B4,B5,B6,B7,B8,B10,B12}
echo "python3 -m perfladder run jax --config full --rungs $JR --out jax_rungs.json --png jax_waterfall.png" >> $C
timeout ${LADDER_S:-420} python3 -m perfladder run jax --config full --rungs $JR --out $OUT/jax_rungs.json \
  --png $OUT/jax_waterfall.png > $OUT/jax.log 2>&1
echo "jax ladder exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
grep -v "^W1\|^I1" $OUT/jax.log | grep -E "^\[|perfladder:" | cut -c1-200 | tail -16
left=$(( ${CALL_S:-585} - ($(date +%s) - T0) ))
if [ $left -gt 40 ]; then
  echo "python3 -m pytest -v -m gpu -p no:cacheprovider --durations=0 tests/jax/test_fused_attention.py" >> $C
  timeout $left python3 -m pytest -v -m gpu -p no:cacheprovider --durations=0 tests/jax/test_fused_attention.py \
    > $OUT/gpu_tests_jax.log 2>&1
  echo "gpu tests exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
  grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/gpu_tests_jax.log | tail -8
fi
