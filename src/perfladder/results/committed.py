"""The runs committed under ``benchmarks/results/``, read the one way every page reads them
(no framework imports).

* ``read_run(path)``: a committed ladder file as a ``LadderResult``, with what a file written
  earlier lacks filled in from the same run once, here: its device ceilings from the run's own
  probe (``device.json`` beside it) when the file carries none, and its derived fields
  recomputed from its raw data by today's accounting (``perfladder.kernels.accounting.rederive``:
  the one taxonomy for profiles and kernel reports, rooflines from each report's own recipe);
* ``committed_runs(root, framework)``: every committed full-configuration run of today's results
  schema, oldest first: the evidence every claim of the pages is checked against;
* ``reference_run(root, framework)``: the run a page shows when its own build cannot measure
  one, chosen by the rule ``benchmarks/results/reference.txt`` states (``SHOWN_RULES``: today
  the newest complete run on the card it names), or a folder it names;
* ``multi_gpu_run(folder)``: the committed R5 run (``r5.json`` of ``benchmarks/r5_multi_gpu.py``);
* ``repo_root(start)``: the repository (the book root) those folders live in.

A plain ``LadderResult.read`` reads a file exactly as written (the CLI, a build's own results).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from perfladder.kernels.accounting import rederive, reread_report
from perfladder.results.record import FRAMEWORKS, LadderResult
from perfladder.results.schema import digest
from perfladder.results.version import SCHEMA_VERSION

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


# -- every committed run, and which one a page shows ---------------------------------------------
FULL_CONFIG = "full"


def _book_root(root: str | Path | None) -> Path:
    base = Path(root) if root is not None else (repo_root() or repo_root(Path(__file__).parent))
    if base is None:
        raise FileNotFoundError(f"no book root (_config.yml + _toc.yml) above {Path.cwd()} or "
                                f"{Path(__file__).parent}: cannot find {REFERENCE_FILE}")
    return base


def _framework(framework: str | None) -> None:
    if framework is not None and framework not in FRAMEWORKS:
        raise ValueError(f"framework={framework!r} is not valid; valid choices: {FRAMEWORKS}")


@dataclass(frozen=True)
class CommittedRun:
    """One committed ladder file, as much of it as choosing among runs needs."""
    path: Path                          # benchmarks/results/<folder>/<framework>.json
    created: str
    rungs: tuple[tuple[str, str], ...]  # (name, technique key), in ladder order
    learned: bool                       # did the run record its learning check?
    device: str = ""                    # the GPU's name as the run recorded it

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def name(self) -> str:
        return self.path.parent.name


def committed_runs(root: str | Path | None = None, framework: str = "torch") -> list[CommittedRun]:
    """Every committed full-configuration run of ``framework`` written with today's results
    schema (``SCHEMA_VERSION``) and not held to a memory cap, oldest first: the evidence the
    pages' claims are checked against and the dots of ``perfladder.pages.spread``."""
    _framework(framework)
    runs = (_summary(path) for path in sorted((_book_root(root) / RESULTS).glob(f"*/{framework}.json")))
    return sorted((run for run in runs if run is not None), key=lambda run: (run.created, run.name))


_SUMMARIES: dict[tuple[Path, bytes], CommittedRun | None] = {}   # by file and digest of its bytes


def _summary(path: Path) -> CommittedRun | None:
    """``path`` as a ``CommittedRun``, or None when it is not one (unreadable, another config or
    schema, held to a memory cap). The pages ask for the committed runs many times over: each
    file is parsed once for each content it has had in this process."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    key = (path, digest(raw))
    if key not in _SUMMARIES:
        _SUMMARIES[key] = _summarise(path, raw)
    return _SUMMARIES[key]


def _summarise(path: Path, raw: bytes) -> CommittedRun | None:
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    full = (data.get("config") or {}).get("name") == FULL_CONFIG
    # a run held to a memory cap tests which rungs fit a smaller card; its card was shared
    # or held back, so its timings are no sample of the card's speed
    capped = data.get("memory_cap_gib") is not None
    if data.get("schema_version") != SCHEMA_VERSION or not full or capped:
        return None
    return CommittedRun(path, data.get("created") or "",
                        tuple((r.get("name"), r.get("key")) for r in data.get("rungs") or []),
                        data.get("learning") is not None, str(data.get("device") or ""))


def todays_ladder(runs: list[CommittedRun]) -> tuple[tuple[str, str], ...]:
    """The rungs (name, key) of the newest run that recorded its learning check: the ladder the
    code declares today (a run that stopped early records fewer)."""
    done = [run for run in runs if run.learned]
    return done[-1].rungs if done else ()


def _complete_against(runs: list[CommittedRun], ladder) -> list[CommittedRun]:
    """The runs that recorded their learning check and every rung of ``ladder``."""
    return [run for run in runs if run.learned and set(ladder) <= set(run.rungs)]


def _complete(runs: list[CommittedRun], card: str | None) -> list[CommittedRun]:
    runs = [run for run in runs if card is None or card in run.device]
    return _complete_against(runs, todays_ladder(runs))


def complete_runs(root: str | Path | None = None, framework: str = "torch",
                  card: str | None = None) -> list[CommittedRun]:
    """The committed runs (``committed_runs``) that record every rung of today's ladder, by name
    and technique key, and their learning check, oldest first. A run of an earlier ladder (fewer
    rungs, or a name that meant another technique) is evidence for the rungs it shares only.
    ``card`` (e.g. ``H200``): only the runs on a GPU of that name, today's ladder being the
    newest that card's runs record."""
    return _complete(committed_runs(root, framework), card)


def earlier_ladder(runs: list[CommittedRun]) -> tuple[tuple[str, str], ...]:
    """The ladder before today's (``todays_ladder``): the rungs of the newest run that recorded
    its learning check and lacks a rung of today's ladder; ``()`` when there is none."""
    today = set(todays_ladder(runs))
    done = [run for run in runs if run.learned and not today <= set(run.rungs)]
    return done[-1].rungs if done else ()


def complete_on_their_cards(root: str | Path | None = None, framework: str = "torch",
                            earlier: bool = False) -> list[CommittedRun]:
    """The committed runs complete against the newest ladder of their own card (``complete_runs``
    per card), oldest first: a card whose runs predate a rung is not thereby incomplete.
    ``earlier``: also those complete against the ladder before it (``earlier_ladder``), so that
    a rung added to the ladder does not take the runs made just before it out of the evidence
    for the rungs they share."""
    runs = committed_runs(root, framework)
    complete = set()
    for device in {run.device for run in runs}:
        on_card = [r for r in runs if r.device == device]
        complete.update(_complete(on_card, None))
        before = earlier_ladder(on_card) if earlier else ()
        complete.update(_complete_against(on_card, before) if before else ())
    return [run for run in runs if run in complete]


def newest_complete(root: str | Path | None = None, framework: str = "torch",
                    card: str | None = None) -> Path:
    """The folder of the newest complete run of ``framework`` (``complete_runs``), on ``card``
    when one is named."""
    runs = complete_runs(root, framework, card)
    if not runs:
        cards = sorted({run.device for run in committed_runs(root, framework)} - {""})
        on = f" on a card named {card!r} (the committed runs' cards: {', '.join(cards) or 'none'})" if card else ""
        raise ValueError(f"no complete committed {framework} run{on} under {_book_root(root) / RESULTS}")
    return runs[-1].folder


# rule name (a line ``rule NAME`` of reference.txt) -> (how it picks a folder, what a page says)
SHOWN_RULES = {
    "newest-complete": (newest_complete,
                        "the newest complete run (every rung of today's ladder and its learning "
                        "check) among the committed full-configuration runs of today's results "
                        "schema"),
}


@dataclass(frozen=True)
class Pointer:
    """What ``reference.txt`` states."""
    path: Path
    default: str | None            # FOLDER: the run of every framework
    named: dict[str, str]          # FRAMEWORK -> FOLDER
    rule: str | None               # a rule of SHOWN_RULES
    card: str | None               # the rule chooses among the runs on this card only


def _pointer(base: Path) -> Pointer:
    pointer = base / REFERENCE_FILE
    if not pointer.is_file():
        raise FileNotFoundError(f"{pointer} is missing: it states the rule that picks the committed "
                                "run a page shows (or names a folder under benchmarks/results/)")
    default, named, rule, card = None, {}, None, None
    for ln in pointer.read_text().splitlines():
        words = ln.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) == 2 and words[0] == "rule":
            if words[1] not in SHOWN_RULES:
                raise ValueError(f"{pointer}: rule {words[1]!r} is not valid; valid choices: "
                                 f"{', '.join(SHOWN_RULES)}")
            rule = rule or words[1]
        elif len(words) >= 2 and words[0] == "card":
            card = card or " ".join(words[1:])
        elif len(words) == 1:
            default = default or words[0]
        elif len(words) == 2 and words[0] in FRAMEWORKS:
            named.setdefault(words[0], words[1])
        else:
            raise ValueError(f"{pointer}: line {ln.strip()!r} is not 'rule NAME', 'card NAME', 'FOLDER' "
                             f"or 'FRAMEWORK FOLDER' (FRAMEWORK one of {', '.join(FRAMEWORKS)})")
    if rule and default:
        raise ValueError(f"{pointer} states a rule ({rule}) and names a folder for every framework "
                         f"({default}): keep one")
    if card and not rule:
        raise ValueError(f"{pointer} names a card ({card}) but no rule to choose among its runs: "
                         f"add 'rule NAME' (valid choices: {', '.join(SHOWN_RULES)}) or drop the card")
    return Pointer(pointer, default, named, rule, card)


def reference_run(root: str | Path | None = None, framework: str | None = None) -> Path:
    """The committed run a page shows when this build cannot measure one itself: a folder
    under ``benchmarks/results/`` chosen as ``benchmarks/results/reference.txt`` says.

    Each line that is neither blank nor a ``#`` comment is ``rule NAME`` (a rule of
    ``SHOWN_RULES``, applied to each framework's runs), ``card NAME`` (the rule chooses among
    the runs on a GPU of that name only: the book's reference machine), ``FOLDER`` (the run of
    every framework) or ``FRAMEWORK FOLDER`` (that framework's run, which wins for it).
    ``root``: the repository (default: the book root above the working directory, else above
    this package).
    """
    base = _book_root(root)
    _framework(framework)
    ptr = _pointer(base)
    name = ptr.named.get(framework)
    if name is None and ptr.rule is not None:
        return SHOWN_RULES[ptr.rule][0](base, framework or FRAMEWORKS[0], ptr.card)
    name = name or ptr.default
    if name is None:
        raise ValueError(f"{ptr.path} names no run folder" + (f" for {framework}" if framework else ""))
    folder = ptr.path.parent / name
    if not folder.is_dir() or "/" in name or name in (".", ".."):
        choices = sorted(p.name for p in ptr.path.parent.iterdir() if p.is_dir())
        raise ValueError(f"{ptr.path} names {name!r}, which is not a run folder; "
                         f"valid choices: {', '.join(choices)}")
    return folder


def reference_card(root: str | Path | None = None) -> str | None:
    """The card ``reference.txt`` names (``card NAME``: the book's reference machine), or None."""
    return _pointer(_book_root(root)).card


def how_chosen(root: str | Path | None = None, framework: str | None = None) -> str:
    """How the run a page shows was chosen, in words, for the page to state."""
    ptr = _pointer(_book_root(root))
    if ptr.named.get(framework) is None and ptr.rule is not None:
        if ptr.card:
            return (f"chosen by the rule in {REFERENCE_FILE.as_posix()}: the newest complete run among "
                    f"the committed full-configuration runs on the book's reference card ({ptr.card}), "
                    "complete meaning every rung of the newest ladder recorded on that card and its "
                    "learning check; runs on other cards are evidence, not shown")
        return f"chosen by the rule in {REFERENCE_FILE.as_posix()}: {SHOWN_RULES[ptr.rule][1]}"
    return f"named in {REFERENCE_FILE.as_posix()}"


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
