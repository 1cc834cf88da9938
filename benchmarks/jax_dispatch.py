"""Is a JAX rung host-bound? Host time to issue a step against the device step, nnx.jit vs split.

    python benchmarks/jax_dispatch.py --config full --out benchmarks/results/RUN/jax_dispatch.json

For each (dtype, batch) it builds the model twice from the same init and measures two ways of
calling the same training step: ``nnx.jit`` (walks the model and optimizer graph in Python on
every call) and the split/merge ``jax.jit`` step of rung B3 (state split once, donated). For
each: tokens/s with the ladder's timer, and ``host_overhead`` -- the time Python takes to
issue a step with the device idle (no queue holding the call back), beside the pace of steps
issued back to back and the synced step time. When the issue time is close to or
above the step time, the host sets the pace and window-to-window spreads follow the host's
jitter; a step that issues well under its device time is hidden by async dispatch.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

CASES = {"fp32": "float32", "bf16": "bfloat16"}


def parse_cases(text: str) -> list[tuple[str, int]]:
    """``"fp32:64,bf16:512"`` -> ``[("fp32", 64), ("bf16", 512)]``, with clear errors."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        dtype, _, batch = item.partition(":")
        if dtype not in CASES:
            raise ValueError(f"unknown dtype {dtype!r} in --cases item {item!r}; valid choices: {tuple(CASES)}")
        if not batch.isdigit() or int(batch) < 1:
            raise ValueError(f"--cases item {item!r}: the batch after ':' must be a positive integer")
        out.append((dtype, int(batch)))
    if not out:
        raise ValueError("--cases is empty; give items like fp32:64,bf16:512")
    return out


def run_case(lab, dtype: str, batch: int, n: int) -> dict:
    from perfladder.jax import Recipe
    from perfladder.jax.profile import host_overhead

    recipe = Recipe(batch_size=batch, dtype=CASES[dtype])
    ways = {"nnx.jit": lab.build_step(recipe), "split": lab.build_step(recipe.replace(jit="split"))}
    out = {"dtype": dtype, "batch": batch}
    for name, step in ways.items():
        t = lab.measure(step, batch).throughput
        h = host_overhead(step, lab.stream(batch), n)
        out[name] = {"tokens_per_s": t.tokens_per_s, "spread": t.spread, "stable": t.stable,
                     "step_ms": 1e3 * t.step_time_s, **h}
        step.commit()
    out["host_bound"] = {k: out[k]["dispatch_ms_per_step"] >= 0.8 * out[k]["step_ms"] for k in ways}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="smoke or full (default: picked from the device)")
    p.add_argument("--cases", default="fp32:64,bf16:64,bf16:512", help="dtype:batch,... (default %(default)s)")
    p.add_argument("--n", type=int, default=20, help="steps issued without waiting (default %(default)s)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    cases = parse_cases(args.cases)
    if args.n < 2:
        p.error(f"--n={args.n} must be at least 2")

    from perfladder.config import pick_config
    from perfladder.jax import JaxLab, device_name, versions

    cfg = pick_config(args.config)
    lab = JaxLab(cfg, probe=False)
    t0 = time.perf_counter()
    results = []
    for dtype, batch in cases:
        r = run_case(lab, dtype, batch, args.n)
        results.append(r)
        for k in ("nnx.jit", "split"):
            x = r[k]
            print(f"{dtype} b{batch} {k:8s}: {x['tokens_per_s']:>12,.0f} tokens/s (spread {100 * x['spread']:.0f}%), "
                  f"step {x['step_ms']:.2f} ms, issue {x['dispatch_ms_per_step']:.2f} ms/step"
                  + ("  <- host-bound" if r["host_bound"][k] else ""), flush=True)
    data = {"device": device_name(), "config": cfg.name, "versions": versions(),
            "n_issued": args.n, "cases": results, "seconds": time.perf_counter() - t0,
            "method": "ladder timer (warm-up, synced windows until they settle, median); issue time = "
                      "wall time to call the step n times without waiting, after a sync"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
