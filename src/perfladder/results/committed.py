"""The runs committed under ``benchmarks/results/``, read the one way every page reads them
(no framework imports).

* ``read_run(path)``: a committed ladder file as a ``LadderResult``, with what a file written
  earlier lacks filled in from the same run once, here: its device ceilings from the run's own
  probe (``device.json`` beside it) when the file carries none, and its derived fields
  recomputed from its raw data by today's accounting (``perfladder.kernels.accounting.rederive``:
  the one taxonomy for profiles and kernel reports, rooflines from each report's own recipe);
* ``reference_run(root, framework)``: the folder ``benchmarks/results/reference.txt`` names, the
  run a page shows when its own build cannot measure one;
* ``multi_gpu_run(folder)``: the committed R5 run (``r5.json`` of ``benchmarks/r5_multi_gpu.py``);
* ``repo_root(start)``: the repository (the book root) those folders live in.

A plain ``LadderResult.read`` reads a file exactly as written (the CLI, a build's own results).
"""
from __future__ import annotations

import json
from pathlib import Path

from perfladder.kernels.accounting import rederive, reread_report
from perfladder.results.record import FRAMEWORKS, LadderResult

RESULTS = Path("benchmarks") / "results"
REFERENCE_FILE = RESULTS / "reference.txt"
PROBE_FILE = "device.json"          # benchmarks/device_probe.py's output, beside a run's ladders
MULTI_GPU_RUN = "h200x2-r5"


def repo_root(start: str | Path | None = None) -> Path | None:
    """The nearest folder at or above ``start`` (default: cwd) holding ``_config.yml``."""
    here = Path(start or Path.cwd()).resolve()
    for p in (here, *here.parents):
        if (p / "_config.yml").is_file() and (p / "_toc.yml").is_file():
            return p
    return None


# -- one committed ladder ----------------------------------------------------------------------
def read_run(path: str | Path) -> LadderResult:
    """A committed results file, completed from its own run (see the module docstring)."""
    path = Path(path)
    res = LadderResult.read(path)
    probe = path.parent / PROBE_FILE
    if res.roofs is None and probe.is_file():
        res.roofs = roofs_from_probe(probe)
    rederive(res)                  # derived fields by today's accounting, from the raw data
    for r in res.rungs:
        for g in r.gates:      # runs recorded before the book called the chapter "the chapter"
            if g.reference:
                g.reference = g.reference.replace("the seed recipe", "the reference recipe")
    return res.finalize()


def roofs_from_probe(path: Path) -> dict | None:
    """The measured ceilings of ``benchmarks/device_probe.py``'s JSON, as ``LadderResult.roofs``."""
    try:
        probe = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    mm, copy = probe.get("bf16_matmul_tflops"), probe.get("copy_tb_per_s")
    if not mm:
        return None
    return {"matmul_bf16_tflops": mm, "matmul_tf32_tflops": probe.get("tf32_matmul_tflops"),
            "copy_gbps": None if copy is None else 1e3 * copy,
            "source": f"{Path(path).name} (device probe of the same run)",
            "method": probe.get("method", "")}


def reread_kernels(kb: dict, framework: str = "torch") -> dict:
    """A stored kernel report read by today's accounting (``perfladder.kernels.accounting.
    reread_report``: today's taxonomy, the roofline of its own recipe, its rows judged)."""
    return reread_report(kb, framework)


# -- which run a page shows --------------------------------------------------------------------
def reference_run(root: str | Path | None = None, framework: str | None = None) -> Path:
    """The committed run a page shows when this build cannot measure one itself: a folder
    under ``benchmarks/results/`` named in ``benchmarks/results/reference.txt``.

    Each line that is neither blank nor a ``#`` comment is ``FOLDER`` (the run of every
    framework) or ``FRAMEWORK FOLDER`` (that framework's run, which wins for it), so one
    framework's reference can move to a newer run without the other's. ``root``: the
    repository (default: the book root above the working directory, else above this package).
    """
    base = Path(root) if root is not None else (repo_root() or repo_root(Path(__file__).parent))
    if base is None:
        raise FileNotFoundError(f"no book root (_config.yml + _toc.yml) above {Path.cwd()} or "
                                f"{Path(__file__).parent}: cannot find {REFERENCE_FILE}")
    pointer = base / REFERENCE_FILE
    if not pointer.is_file():
        raise FileNotFoundError(f"{pointer} is missing: it names the committed reference run "
                                "(a folder under benchmarks/results/)")
    if framework is not None and framework not in FRAMEWORKS:
        raise ValueError(f"framework={framework!r} is not valid; valid choices: {FRAMEWORKS}")
    default, named = None, {}
    for ln in pointer.read_text().splitlines():
        words = ln.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) == 1:
            default = default or words[0]
        elif len(words) == 2 and words[0] in FRAMEWORKS:
            named.setdefault(words[0], words[1])
        else:
            raise ValueError(f"{pointer}: line {ln.strip()!r} is not 'FOLDER' or 'FRAMEWORK FOLDER' "
                             f"(FRAMEWORK one of {', '.join(FRAMEWORKS)})")
    name = named.get(framework) or default
    if name is None:
        raise ValueError(f"{pointer} names no run folder" + (f" for {framework}" if framework else ""))
    folder = pointer.parent / name
    if not folder.is_dir() or "/" in name or name in (".", ".."):
        choices = sorted(p.name for p in pointer.parent.iterdir() if p.is_dir())
        raise ValueError(f"{pointer} names {name!r}, which is not a run folder; "
                         f"valid choices: {', '.join(choices)}")
    return folder


def multi_gpu_run(folder: str | Path | None = None) -> dict | None:
    """The committed R5 run's ``r5.json`` (default: ``benchmarks/results/h200x2-r5`` of the book
    root above the working directory), or ``None`` when it is not in this checkout or unreadable."""
    if folder is None:
        top = repo_root()
        if top is None:
            return None
        folder = top / RESULTS / MULTI_GPU_RUN
    try:
        return json.loads((Path(folder) / "r5.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
