"""Both ladders' expected programs compiled before a book build runs its notebooks, side by side.

On one GPU a full-config build runs the PyTorch notebook, then the JAX notebook, and each of
them compiles as it goes: the PyTorch ladder's steps in helper processes before its first rung
(``perfladder.ahead.torch``), the JAX ladder's one rung after another. Compiling is CPU work,
timing is GPU and host work, and nothing is timed while programs compile ahead, so
``scripts/build_book.sh`` first runs this stage: one process per framework, at the same time,

* ``torch``: ``perfladder.ahead.torch.stage`` (the steps into inductor's caches), its
  helpers' device memory bounded so that the JAX process keeps ``JAX_RESERVE_BYTES``;
* ``jax``: ``perfladder.ahead.jax.stage`` (steps, gate programs and references, in a
  quarter of the cores' worth of threads) into the persistent compilation cache named by
  ``JAX_COMPILATION_CACHE_DIR``, which the build exports to the notebook's kernel too, with
  XLA's settings the notebook makes (``cublas_gemms``) and no preallocation of the device
  memory;

each writing its report to ``DIR/<framework>.json``. The stage lasts about as long as the
PyTorch side: ``GRACE_S`` after it ends, the JAX side starts no more jobs (they are ordered
most useful first: the guess's own steps, then the gates', then the steps compiled in case a
rung goes the other way), and what it did not compile its ladder compiles as it goes. Each
ladder then finds the report (``perfladder.ahead.done_ahead``), keeps it in its
result and compiles nothing ahead itself; its rungs load their programs from the caches. A framework whose stage failed leaves
no report: its ladder compiles as it would have without the stage, and the stage says so.

    python -m perfladder.ahead.book run DIR [--rungs R2,B3]     # both, side by side
    python -m perfladder.ahead.book one FRAMEWORK DIR [--rungs ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

FRAMEWORKS = ("torch", "jax")
JAX_RESERVE_BYTES = 24 * 2**30      # device memory the JAX process may use beside the helpers
GRACE_S = 30.0                      # how long the JAX side may go on alone once torch is done
ENOUGH = ".enough"                  # the file that tells the JAX side to start no more jobs


def one(framework: str, folder: Path, rungs: list[str] | None = None) -> dict:
    """Compile ``framework``'s expected programs in this process (its side's ``stage``);
    write and return the report."""
    from perfladder.ahead import side
    from perfladder.config import pick_config
    cfg = pick_config(verbose=False)
    ladder = side(framework)                  # no framework imported here
    if framework == "torch":
        report = ladder.stage(cfg, rungs, reserve_bytes=JAX_RESERVE_BYTES)
    else:        # a quarter of the cores: the torch helpers' Python needs the rest
        report = ladder.stage(cfg, rungs, workers=max(1, (os.cpu_count() or 4) // 4),
                              enough=lambda: (folder / ENOUGH).exists())
    report = {**report, "framework": framework, "config": cfg.name}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{framework}.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, folder / f"{framework}.json")          # never a half-written report
    return report


def run(folder: Path, rungs: str | None = None) -> int:
    """Both frameworks at once, each in its own process; one line each. Returns 0 when both
    wrote their report, 1 otherwise (the build goes on: that ladder compiles in place)."""
    t0 = time.perf_counter()
    extra = ["--rungs", rungs] if rungs else []
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}   # beside the torch helpers
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(folder / "jax-cache"))   # the build exports it
    procs = {fw: subprocess.Popen([sys.executable, "-m", "perfladder.ahead.book", "one", fw,
                                   str(folder), *extra], env=env)
             for fw in FRAMEWORKS}
    procs["torch"].wait()
    try:        # the JAX side's jobs are ordered most useful first: what it has not started by
        procs["jax"].wait(timeout=GRACE_S)    # then, its ladder compiles as it goes
    except subprocess.TimeoutExpired:
        (folder / ENOUGH).touch()
        procs["jax"].wait()
    # a report is written whole before its process exits: what it says was done (a process
    # may still exit uncleanly, stopping threads left compiling what was no longer waited for)
    failed = [fw for fw in procs if not (folder / f"{fw}.json").is_file()]
    for fw in FRAMEWORKS:
        if fw in failed:
            print(f"[ahead] {fw}: the stage failed (exit {procs[fw].returncode}); its ladder "
                  "compiles as it goes", flush=True)
        else:
            r = json.loads((folder / f"{fw}.json").read_text())
            print(f"[ahead] {fw}: {len(r['compiled'])} of {r['steps']} expected programs in "
                  f"{r['seconds']:.0f} s" + (f"; not compiled: {', '.join(r['failed'])}" if r["failed"] else ""),
                  flush=True)
    print(f"[ahead] the stage took {time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perfladder.ahead.book", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="both frameworks, side by side")
    r.add_argument("folder", type=Path)
    r.add_argument("--rungs", default=None, help="comma-separated rung names (default: every rung)")
    o = sub.add_parser("one", help="one framework, in this process")
    o.add_argument("framework", choices=FRAMEWORKS)
    o.add_argument("folder", type=Path)
    o.add_argument("--rungs", default=None)
    args = p.parse_args(argv)
    if args.what == "run":
        return run(args.folder, args.rungs)
    try:
        one(args.framework, args.folder, args.rungs.split(",") if args.rungs else None)
    except Exception as e:            # one line; the build goes on without this report
        print(f"[ahead] {args.framework}: {type(e).__name__}: {e}"[:500], file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
