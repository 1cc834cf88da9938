"""The ladder's compiled steps compiled ahead, in helper processes, before its first rung:
``compile_ahead``.

A compiled rung's first call spends 10-18 s on an H200 box compiling its step, most of it
inductor's Python (lowering, scheduling and code generation of the forward and the backward),
on one core, one rung after another, while the others idle. Inductor's FX graph cache and
AOTAutograd's cache keep every compiled graph on disk, keyed by the graph, its input shapes and
the compiler's configuration, so another process that builds the same step loads it in about a
second instead. Before the ladder's first rung, helper processes build the compiled steps the
ladder is expected to run and call each a few times; each rung's own first call then finds its
graphs compiled. Nothing is timed while they run, and each rung still records its first call
and how many of its graphs came from the cache (``Compile.cache_hits``).

Which beyond rungs are kept is known only as the ladder runs, so the steps are a guess: the
recipes of the committed reference run of the same config, else the declared chain with every
beyond rung kept. A wrong guess costs a cache miss, and that rung compiles as it always did.
Left out: R1, whose first call is where the chapter shows what compiling costs, and any recipe
compiled with max-autotune, whose GEMM choices are timed at compile time and baked into the
cached code, so they must be made on an idle GPU. The launch configurations the helpers' first
calls chose for their Triton kernels, timed on a GPU they shared, are deleted from inductor's
autotune cache when they end (``forget_tuning``): each kernel is then timed again by the first
rung that launches it, on the idle GPU, and later rungs reuse that choice as they always did.
Each helper's Triton compiles get its share of the cores (``TORCHINDUCTOR_COMPILE_THREADS``).

Off unless asked (``perfladder.torch.Ladder(..., ahead=True)``): on one H200 the helpers
slowed each other's compiles, some rungs' graphs were not found in the cache (activation
checkpointing, our Triton kernels; each rung's ``details['compile_cache']`` now says why), and
every rung re-timed its kernels, so a book build took longer with it than without it
(``benchmarks/results/h200-book-ahead-2026-12-03/README.md``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COLD = ("R1",)              # rungs whose first call the pages read as the price of compiling
TIMEOUT_S = 600             # the helpers' wall budget; past it they are stopped and rungs compile
CALLS = 3                   # steps per recipe: the optimizer's graphs change after its first step
HELPER_BYTES = 40 * 2**30   # device memory a helper may need: the largest step's first call


def _key(recipe) -> str:
    """What decides the compiled graphs of a recipe's step: everything but a non-compiled
    optimizer's kind (fused or foreach AdamW runs outside the compiled model)."""
    d = recipe.to_dict()
    if d.get("optimizer") != "compiled":
        d["optimizer"] = "default"
    return json.dumps(d, sort_keys=True)


def expected_recipes(lab, rungs: dict, names, reference=None) -> dict:
    """``{rung name: Recipe}``: the compiled steps the ladder is expected to build, one per
    distinct set of graphs, without ``COLD``, multi-GPU or max-autotune rungs. ``reference``:
    a committed ``LadderResult`` of the same framework and config, whose measured recipes are
    the guess; without one, the declared chain with every beyond rung kept."""
    from perfladder.ladder.engine import Chain
    names = [n for n in names if n in rungs and rungs[n].stage != "multi-gpu" and n not in COLD]
    guess = {}
    if (reference is not None and reference.framework == lab.framework
            and reference.config.get("name") == lab.config.name):
        for r in reference.rungs:
            if r.name in names and r.measured and r.recipe:
                try:
                    guess[r.name] = lab.recipe_from_dict(r.recipe)
                except (TypeError, ValueError):     # a recipe field this version lacks
                    continue
    else:
        chain = Chain(rungs, lab)
        for n in names:
            rung = rungs[n]
            try:
                base = chain.base(rung)[1]
                recipe = base if rung.change is None else rung.change(base, lab.config)
            except Exception:                       # a change that needs what only a run knows
                continue
            chain.recipes[n] = guess[n] = recipe
            if rung.stage == "beyond" and not rung.alternative:
                chain.fastest = (n, recipe)
    out, seen = {}, set()
    for n, recipe in guess.items():
        if recipe.compiled and not recipe.autotune and _key(recipe) not in seen:
            seen.add(_key(recipe))
            out[n] = recipe
    return out


def expected_costs(reference) -> dict:
    """``{rung name: seconds}`` each compiled rung of ``reference`` spent on its gates (where a
    compiled step compiles) and first call: which steps to start first."""
    if reference is None:
        return {}
    return {r.name: (r.details.get("seconds") or {}).get("gates", 0.0)
            + (r.compile.first_call_s if r.compile else 0.0) for r in reference.rungs}


def compile_ahead(lab, recipes: dict, workers: int | None = None, costs: dict | None = None,
                  timeout_s: float = TIMEOUT_S) -> dict:
    """Compile ``recipes`` (``{name: Recipe}``) in ``workers`` helper processes (default:
    ``default_workers``) and wait for them. ``costs``: ``{name: seconds}`` expected per recipe
    (the longest are started first). Returns the report: ``steps``, ``workers``, ``seconds``,
    ``compiled`` (names), ``already_cached`` (how many of those a helper found compiled: an
    earlier build's), ``failed`` (``{name: error}``), ``forgotten_tunings``. A helper that
    fails or runs past ``timeout_s`` costs only the rungs it did not compile; an interrupt
    stops every helper before it goes on up."""
    t0 = time.perf_counter()
    report = {"steps": len(recipes), "workers": 0, "seconds": 0.0, "compiled": [], "failed": {},
              "already_cached": 0, "forgotten_tunings": 0}
    if not recipes:
        return report
    n = max(1, min(len(recipes), workers or default_workers(lab, len(recipes))))
    order = sorted(recipes, key=lambda k: -(costs or {}).get(k, 0.0))
    shares = [order[i::n] for i in range(n)]       # longest first, dealt round the helpers
    report["workers"] = n
    since = time.time()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    with tempfile.TemporaryDirectory(prefix="perfladder-ahead-") as tmp:
        procs = []
        try:
            for i, share in enumerate(shares):
                job = Path(tmp) / f"job{i}.json"
                job.write_text(json.dumps({"config": lab.config.to_dict(), "device": str(lab.device),
                                           "recipes": {k: recipes[k].to_dict() for k in share}}))
                with open(Path(tmp) / f"out{i}.jsonl", "w") as log:     # the child keeps its copy
                    procs.append((subprocess.Popen(
                        [sys.executable, "-m", "perfladder.torch.ahead", str(job)],
                        stdout=log, stderr=subprocess.DEVNULL, env=env), share))
            for p, _ in procs:
                try:
                    p.wait(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        finally:                  # an interrupt, or a helper that could not start: stop the rest
            for p, _ in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for i, (p, share) in enumerate(procs):
            done = {}
            for line in (Path(tmp) / f"out{i}.jsonl").read_text().splitlines():
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                done[d["name"]] = d
            for name in share:
                d = done.get(name, {})
                if d and d.get("error") is None:
                    report["compiled"].append(name)
                    report["already_cached"] += d.get("cache_hits", 0) > 0
                else:
                    report["failed"][name] = d.get("error") or f"helper exited {p.returncode} first"
    report["forgotten_tunings"] = forget_tuning(since)
    report["seconds"] = time.perf_counter() - t0
    return report


def forget_tuning(since: float) -> int:
    """Delete the kernel launch configurations inductor's autotune cache took in since ``since``
    (wall-clock seconds; ``*.best_config`` files beside the kernels in its cache folder), so
    that no choice made on a shared GPU is reused. Returns how many."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    gone = 0
    for f in Path(cache_dir()).rglob("*.best_config"):
        try:
            if f.stat().st_mtime >= since:
                f.unlink()
                gone += 1
        except OSError:           # gone already, or not ours to delete: nothing to forget
            continue
    return gone


def default_workers(lab, count: int) -> int:
    """Helpers: a quarter of the CPU cores (each compile also fans its Triton kernels out to
    a pool of processes), and on a GPU one per ``HELPER_BYTES`` of free device memory (three
    on a 141 GB H200: the ladder's batch-2048 steps peak at 32 GiB each); 2 on a CPU."""
    cores = os.cpu_count() or 1
    room = 2
    if lab.on_gpu:
        import torch
        room = int(torch.cuda.mem_get_info(lab.device)[0] // HELPER_BYTES)
    return max(1, min(count, cores // 4 or 1, room))


def summary(report: dict) -> str:
    """One line for the result's notes and the page."""
    if not report["steps"]:
        return "compiled ahead: nothing (no compiled step expected)"
    line = (f"compiled ahead: {len(report['compiled'])} of {report['steps']} expected compiled "
            f"steps in {report['workers']} helper processes, {report['seconds']:.0f} s before the "
            "first rung (each rung's first call then loads its graphs from inductor's cache)")
    if report.get("already_cached"):
        line += f"; {report['already_cached']} of them were in the cache already"
    if report["failed"]:
        first = next(iter(report["failed"].items()))
        line += f"; not compiled ahead: {', '.join(report['failed'])} ({first[0]}: {first[1][:200]})"
    return line


# -- a helper process ---------------------------------------------------------------------------
def _helper(job_path: str) -> None:
    """Build and call each recipe of the job file; one JSON line per recipe on stdout."""
    import torch

    from perfladder.config import LadderConfig
    from perfladder.torch.lab import TorchLab
    from perfladder.torch.recipe import Recipe
    from perfladder.torch.timer import cache_events, loaded

    job = json.loads(Path(job_path).read_text())
    lab = TorchLab(LadderConfig(**job["config"]), device=job["device"], probe=False)
    for name, d in job["recipes"].items():
        t0, error = time.perf_counter(), None
        with cache_events() as caches:
            try:
                recipe = Recipe.from_dict(d)
                step = lab.build_step(recipe)
                stream = lab.stream(recipe.batch_size)
                for _ in range(CALLS):
                    step(*next(stream))
                if lab.on_gpu:
                    torch.cuda.synchronize()
                del step
            except Exception as e:           # reported; the rung compiles for itself
                error = f"{type(e).__name__}: {e}"[:500]
        lab.free()
        torch._dynamo.reset()
        print(json.dumps({"name": name, "seconds": time.perf_counter() - t0, "error": error,
                          "cache_hits": loaded(caches)}), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="perfladder: compile a ladder's steps ahead (a helper)")
    p.add_argument("job", help="the job file compile_ahead wrote")
    _helper(p.parse_args().job)
