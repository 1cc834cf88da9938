"""Does compiling the JAX ladder's programs side by side, in threads, change the kernels XLA
chooses? And what does it save? One process, the full config on a GPU:

1. ``--rung``'s step (default: the reference run's fastest) compiled alone, on the idle GPU,
   in a process of its own with a fresh cache: its optimized HLO (the GEMM algorithms XLA's
   autotuning chose are in each call's backend config) and its compile seconds;
2. every expected program compiled ahead in threads (``perfladder.jax.ahead``), into a fresh
   persistent cache, as a ladder does before its first rung: the report;
3. every expected step built again and compiled as its rung would: the seconds of each load,
   and, for ``--rung``, the loaded program's HLO against the one compiled alone.

    XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=src python3 benchmarks/jax_ahead_probe.py --out probe.json

(no preallocation: two processes share the GPU one after the other). ``--twice``: the control,
the step compiled alone in two processes, one after the other, their programs compared.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from perfladder.jax.compiler import cublas_gemms

cublas_gemms()                    # as the notebook and the command line do, before the backend

import jax  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.jax import ahead  # noqa: E402
from perfladder.jax.lab import JaxLab  # noqa: E402
from perfladder.jax.rungs import RUNGS  # noqa: E402
from perfladder.jax.timer import cache_hit_count  # noqa: E402
from perfladder.jax.trial import gate_batches  # noqa: E402
from perfladder.ladder import engine, expected  # noqa: E402


def instructions(text: str) -> list[str]:
    """The program's instructions, backend configs (the chosen algorithms) included, without
    their source metadata and the tables of source files and frames (which name the code that
    built the step: this script in one process, perfladder.jax.ahead in the other)."""
    out = []
    for line in text.splitlines():
        if re.match(r"^\s*\d+ ", line):                 # a file, function or frame table row
            continue
        out.append(re.sub(r",? metadata=\{[^}]*\}", "", line))
    return out


def differing(a: list[str], b: list[str]) -> int:
    return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rung", default=None, help="the step compared (default: the reference's fastest)")
    p.add_argument("--out", required=True)
    p.add_argument("--config", default="full", help="full (default) or smoke (a dry run on a CPU)")
    p.add_argument("--alone", action="store_true", help="(internal) step 1, in its own process")
    p.add_argument("--twice", action="store_true",
                   help="the control instead: the step compiled alone twice, in two processes")
    args = p.parse_args()
    if args.config == "smoke":                       # a CPU: the cache is set by hand
        jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="probe-cache-"))
    lab = JaxLab(get_config(args.config), probe=False)   # on a GPU: a fresh persistent cache
    reference, history = expected.committed_runs(lab)
    recipes = expected.expected_recipes(lab, RUNGS, engine.check_rungs(RUNGS, None), reference,
                                        history, compiles=ahead.compiles)
    name = args.rung or reference.fastest
    if name not in recipes:
        print(f"--rung {name!r} is not an expected step; valid choices: {', '.join(recipes)}",
              file=sys.stderr)
        return 2
    if args.alone:                                               # 1: in a process of its own
        X, Y = gate_batches(lab, recipes[name].batch_size)[0]
        t0 = time.perf_counter()
        text = lab.build_step(recipes[name]).lower(X, Y).compile().as_text()
        with open(args.out, "w") as f:
            json.dump({"seconds": time.perf_counter() - t0, "hlo": text}, f)
        return 0
    def compiled_alone() -> dict:
        alone_file = args.out + ".alone.json"
        subprocess.run([sys.executable, __file__, "--alone", "--rung", name, "--config", args.config,
                        "--out", alone_file], check=True)
        with open(alone_file) as f:
            alone = json.load(f)
        os.remove(alone_file)
        return alone
    alone = compiled_alone()
    text_alone = alone["hlo"]
    out = {"rung": name, "recipe": recipes[name].to_dict(), "alone_compile_s": alone["seconds"],
           "xla_flags": os.environ.get("XLA_FLAGS", ""), "device": lab.device_name,
           "versions": lab.result.versions}
    if args.twice:          # the control: two compiles alone, each on the idle GPU
        a, b = instructions(text_alone), instructions(compiled_alone()["hlo"])
        out.update(same_hlo=a == b, differing_lines=differing(a, b),
                   examples=[(x, y) for x, y in zip(a, b) if x != y][:5])
        print(json.dumps({k: out[k] for k in ("rung", "same_hlo", "differing_lines")}), flush=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
        return 0
    report = ahead.compile_ahead(ahead.expected_jobs(lab, recipes))   # 2: as a ladder does
    out["ahead"] = report
    print(ahead.summary(report), flush=True)

    loads = {}                                                   # 3: each rung's own compile
    for n, recipe in recipes.items():
        Xn, Yn = gate_batches(lab, recipe.batch_size)[0]
        t0, h0 = time.perf_counter(), cache_hit_count()
        try:
            compiled = lab.build_step(recipe).lower(Xn, Yn).compile()
        except Exception as e:               # one that cannot compile here (cuDNN on a CPU)
            loads[n] = {"error": f"{type(e).__name__}: {e}"[:300], "seconds": 0.0, "loaded": 0}
            continue
        loads[n] = {"seconds": time.perf_counter() - t0, "loaded": cache_hit_count() - h0}
        if n == name:
            text_loaded = compiled.as_text()
    out["load_s"] = loads
    a, b = instructions(text_alone), instructions(text_loaded)
    out["same_hlo"] = a == b
    out["gemm_calls"] = sum("__cublas$" in x for x in a)
    out["differing_lines"] = differing(a, b)
    out["examples"] = [(x, y) for x, y in zip(a, b) if x != y][:5]
    print(json.dumps({k: out[k] for k in ("rung", "alone_compile_s", "same_hlo", "differing_lines",
                                          "gemm_calls")}),
          flush=True)
    print(f"loads: {sum(v['loaded'] for v in loads.values())} of {len(loads)} from the cache, "
          f"{sum(v['seconds'] for v in loads.values()):.1f} s in all", flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
