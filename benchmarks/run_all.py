"""Run both frameworks' ladders on this machine, one command, and print them side by side.

    python benchmarks/run_all.py --config full --out benchmarks/results/h200
    python benchmarks/run_all.py --config smoke --out /tmp/smoke --rungs-torch R0,R1 --rungs-jax R1

Each framework runs in its own process (JAX preallocates most of the GPU's memory, and
neither framework should share a process with the other), through the project's CLI, so
what is committed is exactly what ``perfladder run`` writes. Afterwards the two JSON files
are read back (validated), a comparison table is printed, and the waterfalls are drawn.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def run_one(framework: str, args, out: Path) -> Path | None:
    path = out / f"{framework}.json"
    cmd = [sys.executable, "-m", "perfladder", "run", framework, "--out", str(path),
           "--png", str(out / f"{framework}_waterfall.png")]
    if args.config:
        cmd += ["--config", args.config]
    rungs = getattr(args, f"rungs_{framework}")
    if rungs:
        cmd += ["--rungs", rungs]
    if args.no_learn:
        cmd.append("--no-learn")
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    log = out / f"{framework}.log"
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        f.write(proc.stdout)
    print(proc.stdout[-6000:], flush=True)
    print(f"{framework}: exit {proc.returncode} after {time.perf_counter() - t0:.0f}s (log: {log})", flush=True)
    return path if proc.returncode == 0 and path.exists() else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="smoke | full (default: picked from the device)")
    p.add_argument("--out", required=True, help="folder for torch.json, jax.json, PNGs and logs")
    p.add_argument("--frameworks", default="torch,jax")
    p.add_argument("--rungs-torch", default=None)
    p.add_argument("--rungs-jax", default=None)
    p.add_argument("--no-learn", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done = [run_one(fw, args, out) for fw in args.frameworks.split(",")]
    paths = [d for d in done if d is not None]
    if paths:
        import matplotlib
        matplotlib.use("Agg")
        from perfladder.pages.plot import compare, comparison_table
        from perfladder.results.record import LadderResult
        results = [LadderResult.read(pth) for pth in paths]
        print(comparison_table(results))
        compare(results, out / "comparison.png")
    return 0 if len(paths) == len(done) else 1


if __name__ == "__main__":
    sys.exit(main())
