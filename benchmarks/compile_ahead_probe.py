"""Which of the ladder's compiled steps a rung loads from the compiler's cache after helper
processes compiled them ahead (``perfladder.torch.ahead``), and why not where it does not, on a
GPU.

    PYTHONPATH=src python3 benchmarks/compile_ahead_probe.py [--rungs R2,R4,B8,B12,B14]
        [--results torch.json] [--config full] [--workers N] [--out probe.json]

In a fresh inductor cache folder: ``compile_ahead`` of the named rungs' recipes (the recipes a
committed ladder ran, ``--results``, default the reference run's torch.json), then each step built
in this process and called once, as a rung's first call, inside ``perfladder.torch.timer.
cache_events``. One line per rung: its first call's seconds, the graphs loaded and compiled,
and what the compiler said of any graph it would not cache. Run it on an otherwise idle GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "h200-serial-book" / "torch.json"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rungs", default="R2,R4,B8,B12,B14")
    p.add_argument("--results", default=str(DEFAULT_RESULTS))
    p.add_argument("--config", default="full", choices=("full", "smoke"), help="smoke: a CPU check")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    from perfladder.torch.rungs import RUNGS
    names = [n for n in a.rungs.split(",") if n]
    unknown = [n for n in names if n not in RUNGS]
    if unknown:
        print(f"compile_ahead_probe: --rungs {','.join(unknown)} not valid; valid choices: "
              f"{', '.join(RUNGS)}", file=sys.stderr)
        return 2
    # a fresh cache, before anything compiles: what is loaded was compiled by the helpers
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="perfladder-ahead-probe-")
    from perfladder.config import get_config
    from perfladder.ladder.expected import expected_recipes
    from perfladder.results.committed import read_run
    from perfladder.torch import ahead
    from perfladder.torch.lab import TorchLab
    from perfladder.torch.timer import cache_events

    lab = TorchLab(get_config(a.config), probe=False)
    recipes = expected_recipes(lab, RUNGS, names, read_run(a.results), compiles=ahead.compiles)
    if not recipes:
        print(f"compile_ahead_probe: none of {', '.join(names)} is a compiled step to compile ahead")
        return 0
    report = ahead.compile_ahead(lab, recipes, workers=a.workers)
    print(ahead.summary(report), flush=True)
    rows = {}
    for name, recipe in recipes.items():
        with cache_events() as caches:
            t0 = time.perf_counter()
            step = lab.build_step(recipe)
            step(*next(lab.stream(recipe.batch_size)))
            seconds = time.perf_counter() - t0
        rows[name] = {"recipe": recipe.to_dict(), "first_call_s": seconds, "compile_cache": caches}
        counts = ", ".join(f"{k} {v}" for k, v in caches.items() if k != "bypass_reasons")
        print(f"{name}: first call {seconds:.1f} s; {counts or 'no compile'}", flush=True)
        for reason in caches.get("bypass_reasons", []):
            print(f"    {reason}", flush=True)
        del step
        lab.free()
    if a.out:
        Path(a.out).write_text(json.dumps({"ahead": report, "rungs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
