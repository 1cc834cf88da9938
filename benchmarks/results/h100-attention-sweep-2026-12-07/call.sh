# Issue 46: B12's compiled module and profiled events (where XLA put GELU's backward), then the
# attention kernels' launch configurations, B8's and B12's (bias on load), each alone.
set -u
T0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --find-links .whl-nv --no-compile --no-cache-dir jsonschema > /dev/null 2>&1
C=$OUT/call.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $C
echo "python3 attrib_probe.py OUT/attrib B12 benchmarks/results/h100-jax-b12-2026-12-07/jax.json" >> $C
timeout 200 python3 scratch/attrib_probe.py $OUT/attrib B12 benchmarks/results/h100-jax-b12-2026-12-07/jax.json > $OUT/attrib.log 2>&1
echo "probe exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
grep -v "^W1\|^I1" $OUT/attrib.log | tail -30 | cut -c1-200
left=$(( ${CALL_S:-580} - ($(date +%s) - T0) ))
echo "python3 benchmarks/fused_kernels.py --framework jax --parts kernels --attention-configs --out sweep" >> $C
timeout $left python3 benchmarks/fused_kernels.py --framework jax --parts kernels --attention-configs --out $OUT/sweep > $OUT/sweep.log 2>&1
echo "sweep exit $? after $(( $(date +%s) - T0 )) s" | tee -a $C
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/sweep/jax_fused.json"))
for k, r in d.get("attention_configs", {}).items():
    print(f"{k:24s} {r['ms']:.3f} ms  match {r['matches_default']} rel {r['rel_vs_default']:.1e}")
print(d.get("attention_best"))
for k in ("attention", "attention_bias"):
    print(k, d["kernels"].get(k))
print("errors", d.get("errors"))
PY
