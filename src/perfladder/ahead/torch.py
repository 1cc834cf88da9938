"""The ladder's compiled steps compiled ahead, in helper processes, before its first rung:
``compile_ahead``.

A compiled rung's first call spends 10-18 s on an H200 box compiling its step, most of it
inductor's Python (lowering, scheduling and code generation of the forward and the backward),
on one core, one rung after another, while the others idle. Inductor's FX graph cache and
AOTAutograd's cache keep every compiled graph on disk, keyed by the graph, its input shapes and
the compiler's configuration, so another process that builds the same step loads it in about a
second instead. Before the ladder's first rung, helper processes build the compiled steps the
ladder is expected to run and call each a few times; each rung's own first call then finds its
graphs compiled. Nothing is timed while they run, and each rung still records its first call,
how many of its graphs came from the cache (``Compile.cache_hits``) and, for any that could
not be cached, why (``details['compile_cache']``).

Which beyond rungs are kept is known only as the ladder runs, so the steps are a guess: the
recipes of the committed reference run of the same config, else the declared chain with every
beyond rung kept. Where other committed runs of the ladder went the other way on a beyond rung
in at least a third of them (B6's batch x4 and B9's GELU kernel measure near the noise), the
later rungs' steps are compiled both ways (``perfladder.ahead.expected``). A wrong guess costs a cache miss,
and that rung compiles as it always did: on the H200 a run whose B6 fell within noise
compiled its six later steps in place, about 60 s.
Left out: R1, whose first call is where the chapter shows what compiling costs, and any recipe
compiled with max-autotune, whose GEMM choices are timed at compile time and baked into the
cached code, so they must be made on an idle GPU.

The recipes form one queue, the longest expected compile first. Helpers (a third of the CPU
cores' worth) take the next recipe whose device memory, the peak the reference run measured
for it, fits beside what the busy ones hold: on an H200 three batch-2048 steps at once and
smaller ones beside them. Each helper's Triton compiles get its share of the cores
(``TORCHINDUCTOR_COMPILE_THREADS``). The launch configurations the helpers' first calls chose
for their Triton kernels, timed on a GPU they shared, are deleted from inductor's autotune
cache when they end (``forget_tuning``): each kernel is timed again by the first rung that
launches it, on the idle GPU, and later rungs reuse that choice as they always did.

On by default for the full config on a GPU (``by_default``; ``Ladder(..., ahead=None)``). R4's checkpointed
step cannot be cached (its recompute replays the attention kernels' random state through an
operator inductor's cache refuses); steps with our Triton kernels can (``torch.fused``).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from perfladder.ahead.expected import HELPER_BYTES, rung_of

TIMEOUT_S = 600             # the helpers' wall budget; past it they are stopped and rungs compile
CALLS = 3                   # steps per recipe: the optimizer's graphs change after its first step
STOP_GRACE_S = 10.0         # an idle helper's time to exit on its own before it is killed


def compile_ahead(lab, recipes: dict, workers: int | None = None, costs: dict | None = None,
                  needs: dict | None = None, timeout_s: float = TIMEOUT_S,
                  room: float | None = None) -> dict:
    """Compile ``recipes`` (``{name: Recipe}``) in ``workers`` helper processes (default:
    ``default_workers``) and wait for them. The recipes form one queue, the longest first
    (``costs``: ``{name: seconds}`` expected); an idle helper takes the next one whose device
    memory (``needs``: ``{name: bytes}``, else ``HELPER_BYTES``) fits beside what the busy
    helpers hold, within ``room`` bytes (default ``device_room``).
    Returns the report: ``steps``, ``workers``, ``seconds``, ``compiled`` (names), ``runs``
    (``{name: [start, end]}``, wall-clock seconds of each recipe in its helper),
    ``already_cached`` (how many of those a helper found compiled: an earlier build's),
    ``failed`` (``{name: error}``), ``forgotten_tunings``. A helper that fails or runs past
    ``timeout_s`` costs only the rungs it did not compile; an interrupt stops every helper
    before it goes on up."""
    t0 = time.perf_counter()
    report = {"steps": len(recipes), "workers": 0, "seconds": 0.0, "compiled": [], "failed": {},
              "already_cached": 0, "forgotten_tunings": 0, "runs": {}}
    if not recipes:
        return report
    n = max(1, min(len(recipes), workers or default_workers(lab, len(recipes))))
    todo = sorted(recipes, key=lambda k: -(costs or {}).get(rung_of(k), 0.0))
    need = {k: (needs or {}).get(k, HELPER_BYTES) for k in todo}
    room = device_room(lab) if room is None else room
    report["workers"] = n
    since = time.time()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    with tempfile.TemporaryDirectory(prefix="perfladder-ahead-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"config": lab.config.to_dict(), "device": str(lab.device)}))
        helpers: list[_Helper] = []
        done = False
        try:
            lines: queue.Queue = queue.Queue()
            helpers = [_Helper(job, env, lines) for _ in range(n)]
            _drive(helpers, lines, todo, recipes, need, room, report, deadline=t0 + timeout_s)
            done = True
        finally:     # an idle helper exits when its input ends; the others (an interrupt, a
            t_stop = time.perf_counter()            # helper past the time limit) are killed
            stop_all(helpers, grace_s=STOP_GRACE_S if done else 0.0)
            report["stop_s"] = time.perf_counter() - t_stop
    report["forgotten_tunings"] = forget_tuning(since)
    report["seconds"] = time.perf_counter() - t0
    return report


class _Helper:
    """One helper process: recipes in on its stdin, one JSON line per recipe out on its stdout."""

    def __init__(self, job: Path, env: dict, lines: queue.Queue, argv: list | None = None):
        argv = argv or [sys.executable, "-m", "perfladder.ahead.torch", str(job)]
        self.proc = subprocess.Popen(argv,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)
        self.busy: str | None = None          # the rung it is compiling
        self.alive = True
        # every line it prints, read as it comes (a stray line from a library cannot hide the
        # answer behind it), then None when its output ends
        threading.Thread(target=self._read, args=(lines,), daemon=True).start()

    def _read(self, lines: queue.Queue) -> None:
        try:
            for line in self.proc.stdout:
                lines.put((self, line))
        except (OSError, ValueError):         # the pipe closed under the reader: it stopped
            pass
        finally:
            self.proc.stdout.close()
        lines.put((self, None))

    def give(self, name: str, recipe) -> None:
        self.busy = name
        self.proc.stdin.write(json.dumps({"name": name, "recipe": recipe.to_dict()}) + "\n")
        self.proc.stdin.flush()

    def end_input(self) -> None:
        """No more recipes: an idle helper then exits on its own."""
        try:
            self.proc.stdin.close()
        except OSError:           # a pipe the dead helper left broken: nothing to flush
            pass

    def stop(self, grace_s: float = 0.0) -> None:
        """End of input; an idle helper then exits on its own (and its Triton compile workers
        with it) within ``grace_s``, else, or at once, it is killed. Its output pipe is left to
        the reader thread, which closes it at the end (closing it here would wait for the
        reader's lock, i.e. for the helper)."""
        self.end_input()
        if grace_s > 0:
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def stop_all(helpers: list, grace_s: float) -> None:
    """Stop every helper: all inputs end at once, so the idle ones exit side by side (a torch
    process takes seconds to exit: one after the other, five cost a quarter of a minute), each
    within ``grace_s`` of the first; a busy one, or any at ``grace_s=0``, is killed."""
    for h in helpers:
        h.end_input()
    deadline = time.perf_counter() + grace_s
    for h in helpers:
        h.stop(grace_s=max(0.0, deadline - time.perf_counter()) if h.busy is None else 0.0)


def _drive(helpers, lines: queue.Queue, todo: list, recipes: dict, need: dict, room: float,
           report: dict, deadline: float) -> None:
    """Hand ``todo`` out to idle helpers as the device memory allows, until it is empty and
    every helper has answered (``lines``: what they print), or ``deadline``
    (``time.perf_counter()``) passes."""
    while True:
        held = sum(need[h.busy] for h in helpers if h.busy)
        for h in helpers:
            if h.alive and h.busy is None:
                fits = [k for k in todo if held == 0 or held + need[k] <= room]
                if fits:
                    try:
                        h.give(fits[0], recipes[fits[0]])
                    except OSError:                   # it died before it could be handed work
                        h.alive, h.busy = False, None
                        continue
                    todo.remove(fits[0])
                    held += need[fits[0]]
        if not any(h.busy for h in helpers):
            break
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        try:
            h, line = lines.get(timeout=left)
        except queue.Empty:
            continue
        if line is None:                              # the helper exited (crashed, killed)
            h.alive = False
            h.proc.wait()
            if h.busy:
                report["failed"][h.busy] = f"helper exited {h.proc.returncode} first"
            h.busy = None
            continue
        try:
            d = json.loads(line)
            name = d["name"]
        except (ValueError, TypeError, KeyError):     # a stray line; its answer is yet to come
            continue
        report["runs"][name] = [d.get("start"), d.get("end")]
        if d.get("error") is None:
            report["compiled"].append(name)
            report["already_cached"] += d.get("cache_hits", 0) > 0
        else:
            report["failed"][name] = d["error"]
        h.busy = None
    late = time.perf_counter() >= deadline
    for name in [h.busy for h in helpers if h.busy] + todo:
        report["failed"].setdefault(name, "helpers stopped at their time limit first" if late
                                    else "no helper was left to compile it")


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


def ladder_ahead(lab, rungs: dict, names, room: float | None = None) -> dict:
    """Compile the steps the ladder of ``rungs`` (running ``names``) is expected to build
    (``perfladder.ahead.expected``, guessed from the committed runs), longest first; the
    report of ``compile_ahead``. ``room``: device bytes the helpers may hold (default:
    ``device_room``)."""
    from perfladder.ahead import expected
    recipes, reference = expected.guess(lab, rungs, names, compiles)
    return compile_ahead(lab, recipes, costs=expected.expected_costs(reference),
                         needs=expected.expected_needs(reference, recipes), room=room)


def by_default(lab) -> bool:
    """Whether a ladder compiles ahead when not told (``ahead=None``): for the full config on a
    GPU, where compiles are what a build waits for; not for the smoke config, whose compiles take
    seconds on a CPU, where helpers would cost more than they save."""
    return lab.on_gpu and not lab.config.is_smoke


def stage(config, rungs=None, reserve_bytes: float = 0.0) -> dict:
    """A book build's compile-ahead for the PyTorch ladder (``perfladder.ahead.book``), in this
    process: a lab, the expected steps (``rungs``: only these rungs') in helpers that leave
    ``reserve_bytes`` of the free device memory to others; the report."""
    from perfladder.ladder import engine
    from perfladder.torch.lab import TorchLab
    from perfladder.torch.rungs import RUNGS
    names = engine.check_rungs(RUNGS, rungs)          # a bad name: before any setup
    lab = TorchLab(config, probe=False)
    room = max(0.0, device_room(lab) - reserve_bytes)
    return ladder_ahead(lab, RUNGS, names, room=room)


def compiles(recipe) -> bool:
    """Whether ``recipe``'s step is compiled ahead: a compiled one, unless max-autotune times
    its GEMM choices at compile time (they must be made on an idle GPU), or it is one its rung
    refuses before building (CUDA graphs over cuBLASLt plans), which nothing would load."""
    return recipe.compiled and not recipe.autotune and not recipe.graphs_over_cublaslt_plans


def default_workers(lab, count: int) -> int:
    """Helpers: a third of the CPU cores (each compile is one core of Python, and fans its
    Triton kernels out to a pool of its own share of the cores), at most one per recipe; 2 on a
    CPU. How many compile at once on a GPU is then the device memory's call (``_drive``)."""
    if not lab.on_gpu:
        return max(1, min(count, 2))
    return max(1, min(count, (os.cpu_count() or 1) // 3 or 1))


def device_room(lab) -> float:
    """Bytes the helpers may hold at once: nine tenths of the device memory free now (the
    ladder's own process holds little before its first rung); no limit on a CPU."""
    if not lab.on_gpu:
        return float("inf")
    import torch
    return 0.9 * torch.cuda.mem_get_info(lab.device)[0]


def summary(report: dict) -> str:
    """One line for the result's notes and the page."""
    from perfladder.ahead.expected import summary as line
    return line(report, "compiled steps", "helper processes",
                "each rung's first call then loads its graphs from inductor's cache")


# -- a helper process ---------------------------------------------------------------------------
def _helper(job_path: str) -> None:
    """Build and call each recipe read from stdin (a JSON line each; the config and device are
    in the job file); one JSON line per recipe on stdout."""
    import torch

    from perfladder.config import LadderConfig
    from perfladder.torch.lab import TorchLab
    from perfladder.torch.recipe import Recipe
    from perfladder.torch.timer import cache_events, loaded

    job = json.loads(Path(job_path).read_text())
    lab = TorchLab(LadderConfig(**job["config"]), device=job["device"], probe=False)
    for line in sys.stdin:
        d = json.loads(line)
        t0, start, error = time.perf_counter(), time.time(), None
        with cache_events() as caches:
            try:
                recipe = Recipe.from_dict(d["recipe"])
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
        if lab.on_gpu:
            torch.cuda.empty_cache()         # the next recipe's room is counted from zero
        print(json.dumps({"name": d["name"], "seconds": time.perf_counter() - t0, "error": error,
                          "cache_hits": loaded(caches), "start": start, "end": time.time()}),
              flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="perfladder: compile a ladder's steps ahead (a helper)")
    p.add_argument("job", help="the job file compile_ahead wrote")
    _helper(p.parse_args().job)
