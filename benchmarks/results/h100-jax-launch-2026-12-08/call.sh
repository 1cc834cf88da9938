# Issue 46: the whole JAX ladder alone (B9-B12 included) on one GPU, its kernel report and
# learning check, then the multi-GPU predictions. Run from the repository root with OUT set.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --find-links .whl-nv --no-compile --no-cache-dir jsonschema > /dev/null 2>&1
C=$OUT/call.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $C
python3 -c "import jax, flax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax', flax.__version__)" >> $C 2>&1
nproc >> $C
echo "FRAMEWORKS=jax bash benchmarks/gpu_run.sh start OUT; bash benchmarks/gpu_run.sh wait ${WAIT_S:-550}" >> $C
FRAMEWORKS=jax bash benchmarks/gpu_run.sh start /tmp/out >> $C 2>&1
bash benchmarks/gpu_run.sh wait ${WAIT_S:-550} | tee -a $C | cut -c1-200
bash benchmarks/gpu_run.sh collect $OUT/run > /dev/null
echo "collected after $(( $(date +%s) - T0 )) s" | tee -a $C
