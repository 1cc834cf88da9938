# Issue 46's PyTorch levers 3 and 4 on one GPU: the GEMM tool, then the ladder's chain to B14
# and B16-B18 (CUDA graphs on the fused step, tuned cuBLASLt GEMMs, bias gradients in them),
# its kernel report and learning check, then the new GPU-only tests. Run from the repository
# root with nvmath-python installed and OUT set to an empty folder; everything lands there.
set -u
T0=$(date +%s)
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src PYTHONUNBUFFERED=1
C=$OUT/call.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $C
python3 -c "import torch, nvmath; print('torch', torch.__version__, 'nvmath', nvmath.__version__)" >> $C 2>&1
echo "python3 benchmarks/gemm_algorithms_torch.py --out torch_gemms.json" >> $C
timeout ${GEMM_S:-100} python3 benchmarks/gemm_algorithms_torch.py --out $OUT/torch_gemms.json > $OUT/gemms.log 2>&1
echo "gemm tool exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
tail -30 $OUT/gemms.log
TR=${TORCH_RUNGS:-R3,B1,B6,B8,B9,B12,B14,B16,B17,B18}
echo "python3 -m perfladder run torch --config full --rungs $TR --out torch_rungs.json" >> $C
timeout ${LADDER_S:-380} python3 -m perfladder run torch --config full --rungs $TR --out $OUT/torch_rungs.json > $OUT/torch.log 2>&1
echo "torch ladder exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
grep -E "^\[|perfladder:" $OUT/torch.log | cut -c1-200 | tail -20
left=$(( ${CALL_S:-580} - ($(date +%s) - T0) ))
if [ $left -gt 40 ]; then
  echo "python3 -m pytest -v -m gpu -p no:cacheprovider tests/torch/test_gemm.py" >> $C
  timeout $left python3 -m pytest -v -m gpu -p no:cacheprovider --durations=0 tests/torch/test_gemm.py > $OUT/gpu_tests.log 2>&1
  echo "gpu tests exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
  grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/gpu_tests.log | tail -8
fi
