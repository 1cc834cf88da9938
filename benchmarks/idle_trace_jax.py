"""The device's idle time between kernels in a JAX step, traced (issue 46, lever 4).

For each configuration named, the step is built as its rung builds it, warmed up, then:

* ``per_step``: step-by-step times, each step waited for (``perfladder.jax.profile.per_step_times``);
* ``host_overhead``: the host's cost of issuing a step against the device's pace
  (``perfladder.jax.profile.host_overhead``);
* ``idle``: ``--steps`` steps under ``jax.profiler``; the kernels' intervals on the device's
  streams (all of them: idle means no stream runs a kernel) merged, and the gaps between them:
  how many per step, their milliseconds per step, a histogram of their lengths, and the
  largest, each with the kernels that end before it and start after it. The step's own
  boundaries are among the gaps: the first kernel of a step waits for the host's call.

XLA leaves its command buffers (CUDA graphs) out of a profiled run unless asked: every traced
step is compiled with ``PROFILE_COMMAND_BUFFERS`` over its recipe's own XLA options, so the
trace shows the step as it runs untraced (``--no-profile-command-buffers``: without it).

A configuration is a rung's name: with ``--from RESULTS.json`` the recipe that rung ran in that
results file (``fastest``: the file's fastest configuration); without, the recipe the engine's
chain gives it when every beyond rung before it is kept, skipping alternatives and, on a CPU,
the rungs that need a GPU (as the engine skips them there).

    python benchmarks/idle_trace_jax.py --config full --from OUT/jax.json --rungs fastest,B11 \\
        --out OUT/idle_jax.json

The JSON is written atomically, once every configuration was traced; one that fails (its
compile, say) is recorded with its error in one line, the others still traced, and the exit
status is then 1. On a CPU
(``--config smoke``) the "kernels" are XLA:CPU ops on a thread pool: the numbers test the tool,
not a device.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HISTOGRAM_US = (2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0)   # upper edges; the last bin open
PROFILE_COMMAND_BUFFERS = {"xla_enable_command_buffers_during_profiling": True}


def idle_gaps(spans, names, steps: int, top: int = 10) -> dict:
    """The gaps between the kernels' intervals: ``spans`` (``(start_us, end_us)`` per kernel,
    any stream) and ``names`` (the kernels' names, in the same order) over ``steps`` steps.

    Overlapping or touching intervals are one busy stretch; a gap is the time from the end of
    one stretch to the start of the next. ``largest``: the ``top`` longest, each with the
    kernel that ended last before it and the one that started first after it."""
    if steps < 1 or top < 0:
        raise ValueError(f"idle_gaps needs steps >= 1 and top >= 0; got steps={steps}, top={top}")
    timed = sorted((s[0], s[1], n) for s, n in zip(spans, names) if s is not None)
    if not timed:
        raise ValueError("no kernel in the trace says when it ran: no gaps can be measured")
    gaps = []
    end, last = timed[0][1], timed[0][2]
    for start, stop, name in timed[1:]:
        if start > end:
            gaps.append({"gap_us": start - end, "at_us": end - timed[0][0], "before": last,
                         "after": name})
        if stop >= end:
            end, last = stop, name
    lengths = [g["gap_us"] for g in gaps]
    edges = [0.0, *HISTOGRAM_US]
    bins = {}
    for lo, hi in zip(edges, [*HISTOGRAM_US, None]):
        label = f"{lo:g}-{hi:g} us" if hi is not None else f">= {lo:g} us"
        bins[label] = sum(1 for x in lengths if x >= lo and (hi is None or x < hi)) / steps
    span_us = max(s[1] for s in timed) - timed[0][0]
    idle_us = sum(lengths)
    return {"steps": steps, "kernels_per_step": len(timed) / steps,
            "gaps_per_step": len(gaps) / steps, "idle_ms_per_step": idle_us / steps / 1e3,
            "span_ms_per_step": span_us / steps / 1e3,
            "busy_ms_per_step": (span_us - idle_us) / steps / 1e3,
            "histogram_per_step": bins,
            "largest": sorted(gaps, key=lambda g: -g["gap_us"])[:top]}


def chain_recipe(lab, name: str):
    """The recipe the engine's chain gives rung ``name`` when every beyond rung before it is
    kept: alternatives skipped, and on a CPU the rungs that need a GPU."""
    from perfladder.jax.rungs import RUNGS
    if name not in RUNGS:
        raise ValueError(f"no rung {name!r}; valid choices: {', '.join(RUNGS)}")
    rung = RUNGS[name]
    if rung.stage != "beyond":
        return engine_chain(lab).recipe_of(name)
    recipe = engine_chain(lab).recipe_of(lab.seed_top)
    for r in RUNGS.values():
        if r.stage != "beyond" or (r.name != name and (r.alternative or (r.needs_gpu and not lab.on_gpu))):
            continue
        recipe = r.change(recipe, lab.config)
        if r.name == name:
            return recipe
    raise AssertionError(f"{name} is a beyond rung but not in the registry's order")


def engine_chain(lab):
    from perfladder.jax.rungs import RUNGS
    from perfladder.ladder.engine import LadderRun
    return LadderRun(lab, RUNGS).chain


def file_recipe(lab, path: Path, name: str):
    """The recipe rung ``name`` ran in the results file ``path`` (``fastest``: its fastest)."""
    data = json.loads(path.read_text())
    if name == "fastest":
        name = data.get("fastest")
        if not name:
            raise ValueError(f"{path} names no fastest configuration")
    ran = {r["name"]: r for r in data.get("rungs", []) if r.get("recipe")}
    if name not in ran:
        raise ValueError(f"rung {name!r} ran no recipe in {path}; valid choices: "
                         f"{', '.join(['fastest', *ran])}")
    return name, lab.recipe_from_dict(ran[name]["recipe"])


def trace(lab, recipe, steps: int, top: int, timed: int) -> dict:
    """One configuration's step: built, warmed up, timed step by step, its host overhead, and
    its idle gaps over ``steps`` profiled steps."""
    from perfladder.jax.kernels import trace_kernels
    from perfladder.jax.profile import host_overhead, per_step_times, step_stats
    from perfladder.jax.timer import sync
    step = lab.build_step(recipe)
    stream = lab.stream(recipe.batch_size)
    for _ in range(max(2, lab.config.warmup_steps(recipe.batch_size))):
        out = step(*next(stream))
    sync(out)
    per_step = step_stats(per_step_times(step, stream, timed))
    host = host_overhead(step, stream, max(3, timed // 2))
    events, wall_us = trace_kernels(step, stream, steps, "gpu" if lab.on_gpu else "cpu",
                                    perfetto=lab.on_gpu)
    idle = idle_gaps(events.spans, [n for n, _ in events], steps, top)
    idle["wall_ms_per_step"] = wall_us / steps / 1e3
    idle["timelines"] = list(events.lines)
    step.commit()
    return {"recipe": recipe.to_dict(), "recipe_text": str(recipe), "per_step": per_step,
            "host_overhead": host, "idle": idle}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="full", help="perfladder config: full or smoke")
    p.add_argument("--rungs", default="fastest",
                   help="comma-separated rung names (with --from, 'fastest' too); default fastest")
    p.add_argument("--from", dest="source", default=None,
                   help="a JAX results JSON whose rungs' recipes to trace")
    p.add_argument("--out", required=True, help="the JSON to write")
    p.add_argument("--steps", type=int, default=5, help="profiled steps (default 5)")
    p.add_argument("--timed", type=int, default=20, help="steps timed one by one (default 20)")
    p.add_argument("--top", type=int, default=15, help="largest gaps kept (default 15)")
    p.add_argument("--no-profile-command-buffers", dest="profile_command_buffers",
                   action="store_false", help="profile without XLA's command buffers")
    args = p.parse_args(argv)
    from perfladder.checks import check_int
    from perfladder.config import CONFIG_NAMES, get_config
    from perfladder.outputs import check_output_path, replace_atomically
    if args.config not in CONFIG_NAMES:
        p.error(f"--config {args.config!r} is not valid; valid choices: {', '.join(CONFIG_NAMES)}")
    for opt, lo in (("steps", 1), ("timed", 2), ("top", 0)):
        try:
            check_int(f"--{opt}", getattr(args, opt), lo)
        except ValueError as e:
            p.error(str(e))
    names = [n.strip() for n in args.rungs.split(",") if n.strip()]
    if not names:
        p.error("--rungs names no rung")
    source = None if args.source is None else Path(args.source)
    if source is not None and not source.is_file():
        p.error(f"--from {args.source}: no such file")
    if source is None and "fastest" in names:
        p.error("--rungs fastest needs --from RESULTS.json (the run whose fastest configuration to trace)")
    try:
        out = check_output_path(args.out, "json", "--out")
    except ValueError as e:
        p.error(str(e))

    from perfladder.jax import JaxLab
    from perfladder.jax.device import versions
    lab = JaxLab(get_config(args.config), probe=False)
    try:
        recipes = [file_recipe(lab, source, n) if source is not None else (n, chain_recipe(lab, n))
                   for n in names]
    except ValueError as e:
        p.error(str(e))
    if args.profile_command_buffers:
        recipes = [(n, r.replace(xla_options={**dict(r.xla_options), **PROFILE_COMMAND_BUFFERS}))
                   for n, r in recipes]
    result = {"tool": "benchmarks/idle_trace_jax.py", "config": args.config,
              "device": lab.device_name, "versions": versions(),
              "source": None if source is None else str(source), "steps": args.steps,
              "profile_command_buffers": args.profile_command_buffers,
              "configurations": {}}
    failed = []
    for name, recipe in recipes:
        print(f"{name}: {recipe}", file=sys.stderr, flush=True)
        try:
            entry = trace(lab, recipe, args.steps, args.top, args.timed)
        except Exception as e:       # recorded, and the other configurations still traced
            first = (str(e).strip().splitlines() or [""])[0][:500]
            entry = {"recipe": recipe.to_dict(), "error": f"{type(e).__name__}: {first}"}
            failed.append(name)
            print(f"{name}: failed: {entry['error']}", file=sys.stderr, flush=True)
        else:
            idle = entry["idle"]
            print(f"{name}: {idle['kernels_per_step']:.0f} kernels, {idle['gaps_per_step']:.0f} gaps, "
                  f"{idle['idle_ms_per_step']:.3f} ms idle of {idle['span_ms_per_step']:.3f} ms per step",
                  file=sys.stderr, flush=True)
        result["configurations"][name] = entry
        lab.free()
    replace_atomically(out, (json.dumps(result, indent=1, default=str) + "\n").encode())
    print(f"wrote {out}" + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
