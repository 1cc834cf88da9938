"""One committed rung's step compiled several ways, on a GPU: compile seconds and tokens/s of
each variant, each in its own process with empty compile caches.

    PYTHONPATH=src python3 benchmarks/compile_variants.py [--rung B14] [--results torch.json]
        [--variants whole,regional,graphs] [--out variants.json]

* ``whole``: the rung's step as the ladder compiled it (``torch.compile`` of the whole model).
* ``regional``: regional compilation, one ``Block`` compiled and reused for all six (their code
  and guards are the same; the parameters are inputs), so inductor lowers and generates code
  for one block instead of six, and no fusion crosses a block boundary.
* ``graphs``: the whole model compiled with ``mode='reduce-overhead'`` (CUDA graphs), the
  rung's recipe otherwise unchanged: what B3 measured at batch 512, on this rung's step.
* ``autotune``: the whole model compiled with ``mode='max-autotune-no-cudagraphs'`` (B11's
  technique: inductor times its Triton GEMM templates against cuBLAS for every matmul shape),
  on this rung's step; GPU only.
* ``no_peak_memory_reorder``, ``no_loop_reorder``, ``no_pattern_matcher``, ``no_asserts``,
  ``no_pointwise_autotune``:
  ``whole`` with one of inductor's compile-time passes (``INDUCTOR_SETTINGS``) switched off:
  what that pass costs in compile seconds, and whether the step runs slower without it.

Each variant also records where its first call's seconds went (``compile_phases``: dynamo's
``compilation_time_metrics``, summed per phase, the largest first).

The recipe is the one a committed ladder's rung ran (``--results``, default the reference run's
torch.json). Prints one line per variant and writes the numbers to ``--out``. Run it on an
otherwise idle GPU (``graphs`` needs one).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "h200-serial-book" / "torch.json"


def compile_blocks(model, mode=None):
    """Regional compilation: each block compiled in place (one program, reused by all)."""
    for blk in model.blks:
        blk.compile(dynamic=False, mode=mode)
    return model


INDUCTOR_SETTINGS = {
    "no_peak_memory_reorder": {"reorder_for_peak_memory": False},
    "no_loop_reorder": {"loop_ordering_after_fusion": False},
    "no_pattern_matcher": {"pattern_matcher": False},
    "no_asserts": {"size_asserts": False, "scalar_asserts": False, "alignment_asserts": False},
    "no_pointwise_autotune": {"triton.autotune_pointwise": False},
}
VARIANTS = ("whole", "regional", "graphs", "autotune", *INDUCTOR_SETTINGS)
PHASES_KEPT = 30


def compile_phases() -> dict[str, float]:
    """Seconds per compile phase so far in this process (dynamo's own timers), largest first."""
    from torch._dynamo.utils import compilation_time_metrics
    total = {k: sum(v) for k, v in compilation_time_metrics.items()}
    return dict(sorted(total.items(), key=lambda kv: -kv[1])[:PHASES_KEPT])


def apply_settings(config, settings: dict) -> None:
    """Set inductor's ``settings`` (dotted names: ``triton.autotune_pointwise``) on ``config``."""
    for name, value in settings.items():
        *path, leaf = name.split(".")
        setattr(functools.reduce(getattr, path, config), leaf, value)


def one_variant(variant: str, recipe_dict: dict, config: str) -> dict:
    import torch._inductor.config as inductor_config

    from perfladder.config import get_config
    from perfladder.torch.lab import TorchLab
    from perfladder.torch.timer import compile_count

    apply_settings(inductor_config, INDUCTOR_SETTINGS.get(variant, {}))     # for this process
    lab = TorchLab(get_config(config))
    if variant == "regional":
        lab.use(compile_model=compile_blocks)
    recipe = lab.recipe_from_dict(recipe_dict)
    if variant == "graphs":
        recipe = recipe.replace(cudagraphs=True)
    if variant == "autotune":
        if not lab.on_gpu:
            raise RuntimeError("autotune: the Triton GEMM templates max-autotune times are CUDA "
                               "kernels; run it on a GPU")
        recipe = recipe.replace(autotune=True)
    step = lab.build_step(recipe)
    c0 = compile_count()
    X, Y = next(lab.stream(recipe.batch_size))
    step(X, Y)                      # times its own first call between syncs
    first = sum(step.first_call_s.values())
    phases = compile_phases()
    m = lab.measure(step, recipe.batch_size)
    t, again = m.throughput, m.remeasured
    return {"variant": variant, "recipe": recipe.to_dict(), "first_call_s": first,
            "compilations": compile_count() - c0,
            "tokens_per_s": t.tokens_per_s, "windows": t.windows, "stable": t.stable, "spread": t.spread,
            "remeasured": again, "settings": INDUCTOR_SETTINGS.get(variant, {}), "compile_phases": phases}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rung", default="B14")
    p.add_argument("--results", default=str(DEFAULT_RESULTS))
    p.add_argument("--out", default=None)
    p.add_argument("--config", default="full", choices=("full", "smoke"), help="smoke: a CPU check")
    p.add_argument("--variants", default="whole,regional", help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    a = p.parse_args()
    if not Path(a.results).is_file():
        print(f"compile_variants: --results {a.results!r} is not a file; give a ladder's torch.json",
              file=sys.stderr)
        return 2
    rungs = {r["name"]: r for r in json.loads(Path(a.results).read_text())["rungs"]}
    if a.rung not in rungs or not rungs[a.rung].get("recipe"):
        print(f"compile_variants: no measured rung {a.rung!r} in {a.results}; valid choices: "
              f"{', '.join(n for n, r in rungs.items() if r.get('recipe'))}", file=sys.stderr)
        return 2
    recipe = rungs[a.rung]["recipe"]
    if a.variant:        # the child: one variant, its result as JSON on stdout's last line
        print(json.dumps(one_variant(a.variant, recipe, a.config)))
        return 0
    out = {"rung": a.rung, "recipe": recipe, "variants": []}
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        print(f"compile_variants: --variants {a.variants!r} names "
              f"{', '.join(map(repr, bad)) if bad else 'no variant'}; valid choices: {', '.join(VARIANTS)}",
              file=sys.stderr)
        return 2
    failed = 0
    for variant in variants:
        with tempfile.TemporaryDirectory(prefix="compile-variants-") as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
                   "TRITON_CACHE_DIR": f"{cache}/triton"}
            run = subprocess.run([sys.executable, __file__, "--rung", a.rung, "--results", a.results,
                                  "--config", a.config, "--variant", variant],
                                 env=env, text=True, capture_output=True)
        if run.returncode != 0:      # recorded, and the other variants still run
            failed += 1
            lines = run.stderr.strip().splitlines() or [f"exit {run.returncode}"]
            out["variants"].append({"variant": variant, "error": lines[-1]})
            print(f"{variant:9} FAILED: {lines[-1]}", flush=True)
            continue
        got = json.loads(run.stdout.strip().splitlines()[-1])
        out["variants"].append(got)
        print(f"{variant:9} first call {got['first_call_s']:6.1f} s  {got['tokens_per_s']:>12,.0f} "
              f"tokens/s  spread {got['spread']:.1%}"
              f"{'' if got['stable'] else ' (did not settle)'}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
