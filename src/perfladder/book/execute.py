"""Execute the two ladder notebooks side by side before the book build, one GPU each.

The PyTorch and JAX ladders are independent, and on a machine with two GPUs a book build that
runs them one after the other leaves a GPU idle for half an hour. ``scripts/build_book.sh``
with ``PERFLADDER_BOOK_PARALLEL=1`` calls ``python -m perfladder.book.execute`` first: each ladder
notebook runs in its own process with ``CUDA_VISIBLE_DEVICES`` naming its own GPU and its CPU
affinity set to its own physical cores, and the executed notebooks go into the build's
jupyter-cache. The build that follows then finds them cached and executes only the other pages.

Why whole physical cores: a ladder's host-bound rungs (eager PyTorch, un-jitted JAX) time the
host as much as the GPU. Two processes that share a core's hyperthreads, or that let one
framework's compiler threads run on the other's cores, disturb each other's windows; the
timer then flags the rungs as unsettled, which is honest but useless. Disjoint cores keep the
two ladders' hosts apart.

On a machine without GPUs the same path runs with the CPUs split the same way (the test suite
uses it); the multi-GPU rungs of a ladder notebook see one device and are skipped.

Why a watchdog: nbclient bounds each of its own waits (the kernel's start-up, each cell, the
output after a cell), yet an executor has been seen waiting on an idle kernel past all of them.
Each executor writes its progress (start-up, cell i of n, finished) to a file beside its log;
``side_by_side`` gives each phase nbclient's own bound plus a grace period, and an executor that
outlives it is stopped, with its Python stacks in its log and one line naming the notebook, the
phase and the bound. A long cell is never cut short by it: a cell's bound is nbclient's.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from perfladder.hardware import nvidia_smi

_SYS_CPU = Path("/sys/devices/system/cpu")


def physical_cores(cpus=None, sys_cpu: Path = _SYS_CPU) -> list[list[int]]:
    """The logical CPUs this process may use, grouped by physical core (hyperthread siblings
    together), cores in (package, core id) order. Without topology files every CPU is its
    own core."""
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for c in cpus:
        topo = sys_cpu / f"cpu{c}" / "topology"
        try:
            key = (int((topo / "physical_package_id").read_text()), int((topo / "core_id").read_text()))
        except (OSError, ValueError):
            key = (-1, c)
        groups[key].append(c)
    return [sorted(groups[k]) for k in sorted(groups)]


def split_cores(k: int, cores: list[list[int]]) -> list[list[int]]:
    """``k`` disjoint shares of whole physical cores, as equal as they divide, each a sorted
    list of logical CPUs."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"split_cores: k must be a positive int, got {k!r}")
    if len(cores) < k:
        raise ValueError(f"cannot give {k} notebooks a physical core each: only {len(cores)} "
                         f"core(s) available ({cores})")
    base, extra = divmod(len(cores), k)
    shares, i = [], 0
    for j in range(k):
        n = base + (1 if j < extra else 0)
        shares.append(sorted(c for core in cores[i:i + n] for c in core))
        i += n
    return shares


def cpu_ranges(cpus) -> str:
    """``[0, 1, 2, 5, 16, 17]`` -> ``'0-2,5,16-17'`` (the notation of ``taskset -c``)."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


BUILD_ID_VARIABLE = "PERFLADDER_BUILD_ID"     # set by scripts/build_book.sh, one per build
BUILD_KEY = "_build"                          # where side_by_side.json records it


def status_rows(work: Path, build: str | None = None) -> list[tuple[str, str, str, str]] | None:
    """``(notebook, GPU, CPUs, seconds)`` per notebook of the side-by-side execution in
    ``work``: None when the ladder notebooks ran one after the other, or when ``build`` (a
    build id, default ``$PERFLADDER_BUILD_ID``) is given and the file is another build's."""
    f = Path(work) / "side_by_side.json"
    if not f.is_file():
        return None
    plan = json.loads(f.read_text())
    build = os.environ.get(BUILD_ID_VARIABLE) if build is None else build
    written_by = plan.pop(BUILD_KEY, None)
    if build and written_by != build:
        return None
    return [(name, "-" if p["gpu"] is None else str(p["gpu"]), cpu_ranges(p["cpus"]),
             "cached earlier" if not p["ran"] else f"{p['seconds']:.0f} s") for name, p in plan.items()]


def gpu_count() -> int:
    """GPUs ``nvidia-smi -L`` lists (0 when there is no nvidia-smi or it fails)."""
    listed = nvidia_smi("-L", timeout=60) or ""
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))


def visible_gpus() -> list[str]:
    """The GPUs this process may hand out, as ``CUDA_VISIBLE_DEVICES`` entries: the caller's
    own ``CUDA_VISIBLE_DEVICES`` when it sets one, else every GPU ``nvidia-smi`` lists."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    return [str(i) for i in range(gpu_count())]


def cached(cache_dir: Path, notebook: Path) -> bool:
    """Whether the build's jupyter-cache already holds an execution of this notebook's code."""
    import nbformat
    from jupyter_cache import get_cache
    try:
        get_cache(str(cache_dir)).match_cache_notebook(nbformat.read(notebook, as_version=4))
        return True
    except KeyError:
        return False


STARTUP_TIMEOUT = 60      # s: nbclient's bound on the kernel's start-up (its own default)
STALL_GRACE = 60          # s: beyond nbclient's bound on a phase, before the watchdog stops it


def progress_file(out: Path) -> Path:
    """Where the executor writing ``out`` records its progress, one JSON line per phase."""
    return Path(str(out) + ".progress")


def _progress(out: Path, phase: str, **where) -> None:
    with open(progress_file(out), "a") as f:
        f.write(json.dumps({"phase": phase, **where}) + "\n")


def execute_one(notebook: Path, out: Path, timeout: int) -> int:
    """Run one notebook top to bottom in a fresh kernel (cwd: its folder), write the executed
    copy to ``out`` and its run time to ``out`` + ``.json``. Exit status 1 on a cell error.
    Its progress goes to ``progress_file(out)`` for ``side_by_side``'s watchdog."""
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution
    nb = nbformat.read(notebook, as_version=4)
    cells = len(nb.cells)
    # jupyter-cache lets a notebook's own metadata set its cell timeout (none: no bound)
    own = nb.metadata.get("execution", {}).get("timeout", timeout)
    limit = own if isinstance(own, int) and not isinstance(own, bool) and own > 0 else None
    progress_file(out).unlink(missing_ok=True)
    _progress(out, "start")
    res = single_nb_execution(
        nb, cwd=str(notebook.parent.resolve()), timeout=timeout, allow_errors=False,
        startup_timeout=STARTUP_TIMEOUT,
        on_cell_start=lambda cell, cell_index: _progress(out, "cell", index=cell_index + 1, of=cells,
                                                         timeout=limit))
    _progress(out, "finish")
    if res.err is not None:
        print(res.exc_string, file=sys.stderr)
        return 1
    nbformat.write(res.nb, out)
    Path(str(out) + ".json").write_text(json.dumps({"seconds": res.time}))
    return 0


def phase_bound(phase: dict, timeout: int, grace: float = STALL_GRACE) -> float:
    """Seconds an executor may stay in ``phase`` (a progress line) before it counts as stalled:
    nbclient's own bound on that phase plus ``grace``. A cell's bound is the one its executor
    reports (``timeout`` unless its notebook sets its own; ``None``: the notebook asks for none)."""
    if phase["phase"] == "cell":
        limit = phase.get("timeout", timeout)
        return float("inf") if limit is None else limit + grace
    return {"launch": STARTUP_TIMEOUT, "start": STARTUP_TIMEOUT}.get(phase["phase"], 0) + grace


def phase_text(phase: dict) -> str:
    if phase["phase"] == "cell":
        return f"cell {phase['index']} of {phase['of']}"
    return {"start": "the kernel's start-up", "finish": "writing its notebook and exiting",
            "launch": "starting the executor"}[phase["phase"]]


def _last_phase(out: Path) -> dict:
    """The executor's last complete progress line (one it is writing now is not read)."""
    try:
        text = progress_file(out).read_text()
    except FileNotFoundError:
        text = ""
    lines = text[:text.rfind("\n") + 1].splitlines()
    return json.loads(lines[-1]) if lines else {"phase": "launch"}


def _stop(p: subprocess.Popen, stacks: bool = True) -> None:
    """Stop an executor and everything in its session: its Python stacks into its log first
    (faulthandler on SIGUSR1), then SIGKILL; its kernel follows its parent out. Not SIGTERM:
    nbclient takes that as a request to shut the kernel down and carries on waiting."""
    try:
        if stacks:
            os.kill(p.pid, signal.SIGUSR1)
            time.sleep(1)
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def watch(procs: list, timeout: int, grace: float = STALL_GRACE, poll: float = 1.0) -> list:
    """Wait for every executor in ``procs`` (``(notebook, out, process)``); return their exit
    statuses in order, ``None`` for one stopped, with the reason beside it: stalled, or still
    running when another failed (nothing of a failed run is kept, so its partner's work
    would be thrown away)."""
    seen = {id(p): (None, time.monotonic()) for _, _, p in procs}
    results: dict[int, tuple[int | None, str]] = {}
    while len(results) < len(procs):
        failed = [nb.name for nb, _, p in procs if id(p) in results and results[id(p)][0] != 0]
        for nb, out, p in procs:
            if id(p) in results:
                continue
            rc = p.poll()
            if rc is not None:
                results[id(p)] = (rc, "")
                continue
            if failed:
                _stop(p, stacks=False)
                results[id(p)] = (None, f"stopped when {', '.join(failed)} failed")
                continue
            phase = _last_phase(out)
            last, since = seen[id(p)]
            if phase != last:
                seen[id(p)] = (phase, time.monotonic())
                continue
            bound = phase_bound(phase, timeout, grace)
            if time.monotonic() - since > bound:
                _stop(p)
                results[id(p)] = (None, f"stalled in {phase_text(phase)} for over {bound:.0f} s "
                                        f"(nbclient's own bound plus {grace:.0f} s); stopped, its "
                                        f"Python stacks are at the end of its log")
        if len(results) < len(procs):
            time.sleep(poll)
    return [results[id(p)] for _, _, p in procs]


def _worker_cmd(notebook: Path, out: Path, timeout: int) -> list[str]:
    return [sys.executable, "-m", "perfladder.book.execute", "one", str(notebook), str(out),
            "--timeout", str(timeout)]


def _worker_env(gpu: str | None) -> dict:
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def side_by_side(notebooks: list[Path], cache_dir: Path, work: Path, *, timeout: int = 1800,
                 gpus: list[str] | None = None, log=print, grace: float = STALL_GRACE) -> dict:
    """Execute ``notebooks`` at once, notebook ``i`` on GPU ``gpus[i]`` (``None``: no GPU
    pinning) and on its own share of physical cores, then put each executed notebook into
    the jupyter-cache at ``cache_dir``. Notebooks already cached are not run again.

    Returns ``{notebook name: {"gpu", "cpus", "seconds", "ran"}}`` (also written to
    ``work/side_by_side.json``). Raises ``RuntimeError`` naming each notebook that failed,
    with the tail of its log (one that stalled past its phase's bound is stopped, and so is one
    still running when another has failed: ``watch``); nothing is cached from a failed run."""
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise ValueError(f"timeout must be a positive number of seconds per cell, got {timeout!r}")
    if gpus is not None and len(gpus) < len(notebooks):
        raise ValueError(f"{len(notebooks)} notebooks need {len(notebooks)} GPUs; got {gpus}")
    work.mkdir(parents=True, exist_ok=True)
    shares = split_cores(len(notebooks), physical_cores())
    plan, procs = {}, []
    for i, nb in enumerate(notebooks):
        gpu = None if gpus is None else gpus[i]
        plan[nb.name] = {"gpu": gpu, "cpus": shares[i], "seconds": None, "ran": False}
        if cached(cache_dir, nb):
            log(f"[book] {nb.name}: already cached")
            continue
        out, logf = work / nb.name, work / f"{nb.stem}.log"
        cmd = _worker_cmd(nb, out, timeout)
        log(f"[book] {nb.name}: executing on GPU {gpu if gpu is not None else '-'} and CPUs {cpu_ranges(shares[i])}")
        fh = open(logf, "w")
        progress_file(out).unlink(missing_ok=True)
        # its own session: the watchdog stops the executor and whatever it started at once
        p = subprocess.Popen(cmd, env=_worker_env(gpu), stdout=fh, stderr=subprocess.STDOUT,
                             start_new_session=True,
                             preexec_fn=lambda s=tuple(shares[i]): os.sched_setaffinity(0, s))
        procs.append((nb, out, logf, fh, p))
    failed = []
    try:
        waited = watch([(nb, out, p) for nb, out, _, _, p in procs], timeout, grace)
    except BaseException:           # an interrupt: the notebooks stop with it
        for *_, p in procs:
            _stop(p, stacks=False)
        raise
    for (nb, out, logf, fh, _), (rc, why) in zip(procs, waited):
        fh.close()
        if rc != 0:
            failed.append(f"{nb.name} ({why or f'exit {rc}'}):\n{logf.read_text()[-4000:]}")
            continue
        seconds = json.loads(Path(str(out) + ".json").read_text())["seconds"]
        plan[nb.name].update(seconds=seconds, ran=True)
        log(f"[book] {nb.name}: executed in {seconds:.0f}s")
    if failed:
        raise RuntimeError("executing the ladder notebooks side by side failed:\n" + "\n".join(failed))
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    cache = get_cache(str(cache_dir))
    for nb, out, *_ in procs:
        record = cache.add_nb_to_project(str(nb.resolve()))
        cache.cache_notebook_bundle(CacheBundleIn(nbformat.read(out, as_version=4), record.uri,
                                                  data={"execution_seconds": plan[nb.name]["seconds"]}),
                                    check_validity=False, overwrite=True)
    (work / "side_by_side.json").write_text(json.dumps(
        {**plan, BUILD_KEY: os.environ.get(BUILD_ID_VARIABLE)}, indent=1))
    return plan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perfladder.book.execute", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    one = sub.add_parser("one", help="execute one notebook (a worker of `run`)")
    one.add_argument("notebook", type=Path)
    one.add_argument("out", type=Path)
    one.add_argument("--timeout", type=int, default=1800)
    run = sub.add_parser("run", help="execute notebooks side by side into a jupyter-cache")
    run.add_argument("cache", type=Path, help="the build's jupyter-cache folder")
    run.add_argument("work", type=Path, help="folder for the executed copies, logs and side_by_side.json")
    run.add_argument("notebooks", type=Path, nargs="+")
    run.add_argument("--timeout", type=int, default=1800)
    run.add_argument("--no-gpu", action="store_true",
                     help="do not pin GPUs (a machine without GPUs; the cores are still split)")
    a = ap.parse_args(argv)
    if a.cmd == "one":
        faulthandler.register(signal.SIGUSR1, all_threads=True)   # the watchdog asks for stacks
        return execute_one(a.notebook, a.out, a.timeout)
    for nb in a.notebooks:
        if not nb.is_file():
            ap.error(f"notebook {str(nb)!r} does not exist")
    gpus = None
    if not a.no_gpu:
        gpus = visible_gpus()
        if len(gpus) < len(a.notebooks):
            ap.error(f"{len(a.notebooks)} notebooks side by side need {len(a.notebooks)} GPUs; "
                     f"found {len(gpus)} ({gpus}) (use --no-gpu on a machine without GPUs)")
    try:
        side_by_side(a.notebooks, a.cache, a.work, timeout=a.timeout, gpus=gpus)
    except (RuntimeError, ValueError) as e:
        print(f"perfladder.book.execute: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from perfladder.faults import guarded
    sys.exit(guarded("perfladder.book.execute", main))
