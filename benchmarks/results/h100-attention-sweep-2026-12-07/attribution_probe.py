"""Why only ~30% of JAX's GPU kernel time matches the compiled module's ops: dump the profiled
events (name, hlo_op, hlo_module, us) of a few rungs' steps beside the module text."""
import json, os, sys, time, gzip
import jax
from perfladder.config import get_config
from perfladder.jax.lab import JaxLab
from perfladder.jax.kernels import trace_kernels
from perfladder.jax.program import hlo_op_categories, hlo_module_name

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
run = json.load(open(sys.argv[3]))
recipes = {r["name"]: r["recipe"] for r in run["rungs"] if r.get("recipe")}
GPU = jax.default_backend() == "gpu"
lab = JaxLab(get_config("full" if GPU else "smoke"), probe=False)
for name in sys.argv[2].split(","):
    t0 = time.time()
    d = dict(recipes[name]); d["batch_size"] = d["batch_size"] if GPU else 8
    if not GPU: d["fused"] = []; d["attn_impl"] = None
    rec = lab.recipe_from_dict(d)
    step = lab.build_step(rec)
    stream = lab.stream(rec.batch_size)
    X, Y = next(stream)
    lab.first_call(step, X, Y)
    for _ in range(2):
        jax.block_until_ready(step(*next(stream)))
    t1 = time.time()
    texts = []
    low = step.lower(X, Y)
    texts.append(low.compile().as_text())
    t2 = time.time()
    events, wall = trace_kernels(step, stream, 3, "gpu" if GPU else "cpu", perfetto=True)
    cats = hlo_op_categories(texts[0])
    rows = [(n, d, op, mod, cats.get(op) if op else None) for (n, d), (op, mod) in zip(events, events.ops)]
    tot = sum(r[1] for r in rows)
    matched = sum(r[1] for r in rows if r[4] is not None)
    print(name, rec, "module", hlo_module_name(texts[0]), "matched %.0f%%" % (100 * matched / tot),
          "recompile %.1fs" % (t2 - t1), "total %.0fs" % (time.time() - t0), flush=True)
    mods = {}
    for r in rows:
        mods[r[3]] = mods.get(r[3], 0) + r[1]
    print("  modules:", {k: round(v / tot, 3) for k, v in mods.items()})
    unm = {}
    for r in rows:
        if r[4] is None:
            unm[(r[0], r[2])] = unm.get((r[0], r[2]), 0) + r[1]
    for (n, op), d in sorted(unm.items(), key=lambda kv: -kv[1])[:25]:
        print(f"   unmatched {d / 3e3:7.2f} ms/step  name={n[:60]} op={op}")
    with gzip.open(f"{out}/{name}_hlo.txt.gz", "wt") as f:
        f.write(texts[0])
    with open(f"{out}/{name}_events.json", "w") as f:
        json.dump(rows, f)
    lab.free()
