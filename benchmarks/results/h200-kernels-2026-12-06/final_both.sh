# The attention kernels before and after in each framework, then each ladder (a subset of rungs)
# alone, one after the other, all results into $OUT. Run from the repository root.
set -u
T0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
C=$OUT/call.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $C
timeout 60 python3 benchmarks/results/h200-kernels-2026-12-06/attention_old_new.py $OUT/attn.json 2048 >> $C 2>&1; echo "torch old/new exit $?" | tee -a $C
grep "^{" $C | tail -1 | cut -c1-500
TR=${TORCH_RUNGS:-R3,R4,B1,B5,B6,B8,B9,B12,B14,B15}
echo "python3 -m perfladder run torch --config full --rungs $TR --out torch.json" >> $C
timeout ${TORCH_S:-260} python3 -m perfladder run torch --config full --rungs $TR --out $OUT/torch.json > $OUT/torch.log 2>&1
echo "torch ladder exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
grep -E "^\[|perfladder:" $OUT/torch.log | cut -c1-180 | tail -16
timeout 80 python3 benchmarks/results/h200-kernels-2026-12-06/attention_old_new_jax.py $OUT/attn_jax.json 2048 >> $C 2>&1; echo "jax old/new exit $?" | tee -a $C
grep "^{" $C | tail -1 | cut -c1-500
JR=${JAX_RUNGS:-R3,R4,B1,B4,B5,B6,B7,B8}
echo "python3 -m perfladder run jax --config full --rungs $JR --out jax.json" >> $C
left=$(( ${CALL_S:-565} - ($(date +%s) - T0) ))
timeout $left python3 -m perfladder run jax --config full --rungs $JR --out $OUT/jax.json > $OUT/jax.log 2>&1
echo "jax ladder exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
grep -v "^W1\|^I1" $OUT/jax.log | grep -E "^\[|perfladder:" | cut -c1-180 | tail -14
