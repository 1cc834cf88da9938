"""What XLA's Triton GEMMs cost the JAX ladder to compile, and what they buy it at run time.

XLA's GPU compiler autotunes every GEMM among cuBLAS(Lt) algorithms *and* Triton GEMM
configurations; each Triton candidate is compiled before it is timed. This runs the same JAX
rungs twice, each time in a fresh process with a fresh compilation cache: once as XLA comes,
once with ``XLA_FLAGS=--xla_gpu_enable_triton_gemm=false`` (the GEMMs still autotuned, among
cuBLAS's algorithms only), and prints, per rung, tokens/s, the first call (the compile) and
the gates' seconds side by side.

    PYTHONPATH=src python3 benchmarks/xla_triton_gemm.py --out DIR [--rungs R0,R1,R2,B4,B8]

Each run's results JSON is left in DIR (``default.json``, ``cublas.json``). ``--config smoke``
walks the same path on a CPU (where the flag changes nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {"default": "", "cublas": "--xla_gpu_enable_triton_gemm=false"}


def run(name: str, flags: str, rungs: str, config: str, out: Path) -> float:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
    cmd = [sys.executable, "-m", "perfladder", "run", "jax", "--config", config, "--rungs", rungs,
           "--no-learn", "--quiet", "--overwrite", "--out", str(out / f"{name}.json")]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    print(f"== {name} (XLA_FLAGS={env['XLA_FLAGS']!r}): exit {proc.returncode}, {wall:.0f} s", flush=True)
    return wall


def table(out: Path) -> list[str]:
    runs = {n: json.loads((out / f"{n}.json").read_text()) for n in SETTINGS
            if (out / f"{n}.json").exists()}
    if len(runs) < 2:
        return ["(a run is missing: see its log)"]
    a, b = ({r["name"]: r for r in runs[n]["rungs"]} for n in SETTINGS)
    lines = ["rung  tokens/s default -> cublas (x)      first call s     gates s        total s"]
    for name, ra in a.items():
        rb = b.get(name)
        if rb is None or not ra.get("tokens_per_s") or not rb.get("tokens_per_s"):
            continue
        sa, sb = ra["details"]["seconds"], rb["details"]["seconds"]
        fa, fb = ((r.get("compile") or {}).get("first_call_s") or 0 for r in (ra, rb))
        lines.append(f"{name:5s} {ra['tokens_per_s']:>12,.0f} -> {rb['tokens_per_s']:>10,.0f} "
                     f"({rb['tokens_per_s'] / ra['tokens_per_s']:.3f})  {fa:6.1f} -> {fb:5.1f}  "
                     f"{sa.get('gates', 0):5.1f} -> {sb.get('gates', 0):5.1f}  "
                     f"{sa.get('total', 0):6.1f} -> {sb.get('total', 0):5.1f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--rungs", default="R0,R1,R2,B4,B8")
    ap.add_argument("--config", default="full")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, flags in SETTINGS.items():
        run(name, flags, args.rungs, args.config, args.out)
    print("\n".join(table(args.out)), flush=True)


if __name__ == "__main__":
    main()
