"""Command line: ``perfladder run | plot | table``.

    perfladder run torch --config full --rungs R0,R1,R2 --out results/torch.json
    perfladder run jax                      # config picked from the device, printed
    perfladder plot results/torch.json -o waterfall.png
    perfladder plot results/torch.json results/jax.json -o both.png   # side by side
    perfladder table results/torch.json results/jax.json
    perfladder --version
"""
from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import time

from perfladder import __version__
from perfladder.config import CONFIG_NAMES, gpu_present, pick_config
from perfladder.data import CorpusError
from perfladder.faults import (
    DEBUG_VARIABLE,
    ENVIRONMENT_CAUSES,
    EXIT_INCOMPLETE,
    OutputClosed,
    UserError,
    annotate,
    debug_requested,
    environment_cause,
    guarded,
    say,
)
from perfladder.outputs import (
    OutputError,
    RunFiles,
    check_output_path,
    user_path,
    write_all,
)
from perfladder.pages.report import text_table
from perfladder.results import ResultsError
from perfladder.results.record import FRAMEWORKS, LadderResult
from perfladder.run_checks import (  # noqa: F401  (CLIError, parse_rungs: importable from here too)
    CACHE_VARIABLES,
    CLIError,
    check_environment,
    memory_cap,
    parse_rungs,
    read_resume,
)


class Progress:
    """One line per rung on stderr: which rung, how long it took, what it measured."""

    def __init__(self, total: int, stream=None):
        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self._stream, self._start = stream, None

    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stderr   # as redirected now

    def __call__(self, event: str, name: str, payload=None):
        if event == "start":
            self._start = time.perf_counter()
            print(f"[{self.done + 1}/{self.total}] {name} ...", file=self.stream, flush=True)
        elif event == "end":
            self.done += 1
            dt = time.perf_counter() - (self._start or self.t0)
            print(f"[{self.done}/{self.total}] {name} done in {dt:.1f}s: {payload}", file=self.stream, flush=True)


def run_outputs(out, png) -> tuple:
    """``(json_path, figure_path)`` that ``run --out/--png`` will write (None where not asked),
    checked before any work starts."""
    return (None if out is None else check_output_path(out, "json", "--out"),
            None if png is None else check_output_path(png, "figure", "--png"))


def waterfall_writer(result: LadderResult):
    """The figure writer of ``result`` (None when no rung measured anything to draw)."""
    if not result.waterfall():
        return None

    def figure(tmp):
        import matplotlib.pyplot as plt

        from perfladder.pages.plot import waterfall
        plt.close(waterfall(result, tmp))
    return figure


WRITING = "<writing>"       # Tracker.current once the ladder is done and its files are written


class Tracker:
    """Which rung is in flight (for the interrupt line), forwarding to ``Progress`` unless quiet."""

    def __init__(self, progress: Progress | None):
        self.progress, self.current, self.finished = progress, None, []

    def __call__(self, event: str, name: str, payload=None):
        if event == "start":
            self.current = name
        elif event == "end":
            self.current = None
            self.finished.append(name)
        if self.progress is not None:
            self.progress(event, name, payload)

    def where(self) -> str:
        def shown(name):
            return "the learning check" if name == "learning" else name
        if self.current == WRITING:
            return "while writing the results"
        if self.current is not None:
            return f"during {shown(self.current)}"
        return f"after {shown(self.finished[-1])}" if self.finished else "before the first rung"


def before_backend(fw, framework: str, config: str | None) -> bool:
    """The full configuration's compiler settings, made before ``fw.has_gpu()`` starts the
    framework's backend (XLA reads ``XLA_FLAGS`` once): on a GPU, JAX's matmuls from cuBLAS's
    autotuned algorithms (``perfladder.jax.compiler``), as the JAX notebook's first cell does.
    Whether a setting was made."""
    if framework != "jax" or (config or os.environ.get("PERFLADDER_CONFIG")) == "smoke" or not gpu_present():
        return False
    return fw.cublas_gemms()


def cmd_run(args) -> int:
    json_path, figure_path = run_outputs(args.out, args.png)
    if args.framework not in FRAMEWORKS:
        raise CLIError(f"framework {args.framework!r} is not valid; valid choices: {FRAMEWORKS}")
    if args.config is not None and args.config not in CONFIG_NAMES:
        raise CLIError(f"--config {args.config!r} is not valid; valid choices: {', '.join(CONFIG_NAMES)}")
    memory_cap(args.memory_cap_gib)
    check_environment()
    try:
        fw = importlib.import_module(f"perfladder.{args.framework}")
    except ImportError as e:
        raise CLIError(f"perfladder.{args.framework} cannot be imported ({e}); "
                       f"is {args.framework} installed in this python ({sys.executable})?") from e
    rungs = parse_rungs(args.rungs, list(fw.RUNGS))
    before_backend(fw, args.framework, args.config)
    try:
        cfg = pick_config(args.config, has_gpu=fw.has_gpu())
    except ValueError as e:          # e.g. a bad $PERFLADDER_CONFIG
        raise CLIError(str(e)) from e
    resume, earlier = (None, None) if args.resume is None else read_resume(args.resume, args.framework, cfg.name)
    files = RunFiles(json_path, figure_path, overwrite=args.overwrite, resume=resume)
    from perfladder.ladder.engine import check_rungs
    names = check_rungs(fw.RUNGS, rungs)              # optional rungs only when named
    if args.no_learn:     # said even with --quiet: the only runtime guard of the targets is off
        print("perfladder: --no-learn: no learning check; targets shifted against their inputs "
              "(which every gate passes) go unchecked in this run", file=sys.stderr, flush=True)
    tracker = Tracker(None if args.quiet else Progress(len(names) + (0 if args.no_learn else 1)))
    command = "perfladder " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        ahead = {} if args.compile_ahead is None else {"ahead": args.compile_ahead}
        result = fw.run_ladder(cfg, rungs=names, learn=not args.no_learn, progress=tracker,
                               command=command, resume=earlier, checkpoint=files.checkpoint, **ahead)
        tracker.current = WRITING
        return finish_run(result, files)
    except KeyboardInterrupt as e:   # the one line says where it stopped and what is saved
        raise annotate(e, f"{tracker.where()}; {files.saved_line()}")
    except (UserError, OutputClosed):
        raise                        # their own words say what happened to the files
    except Exception as e:
        if tracker.current == "learning" and files.saved:
            try:
                return learning_failed(e, files)
            except ResultsError:      # the progress file is gone: said as if it had not been saved
                pass
        if environment_cause(e) is not None:
            print(f"perfladder: incomplete: {tracker.where()}: {machine_words(e)}; "
                  f"{files.saved_line()}", file=sys.stderr, flush=True)
            return EXIT_INCOMPLETE
        raise annotate(e, files.saved_line())


def machine_words(e: BaseException) -> str:
    """``'no space left on the device (OSError: [Errno 28] ...)'``: the machine's part in ``e``
    and its first line."""
    inner = getattr(e, "inner_exception", None) or e
    first = (str(inner).strip().splitlines() or [""])[0][:200]
    cause = environment_cause(e)
    what = f"{type(inner).__name__}: {first}"
    return f"{ENVIRONMENT_CAUSES[cause]} ({what})" if cause else what


def learning_failed(e: BaseException, files: RunFiles) -> int:
    """The learning check raised after the rungs were saved (its configuration could not be
    built or trained: the machine, or what failed an earlier rung): recorded in the run's
    notes, the ladder written and printed as any other, and one line."""
    result = LadderResult.read(files.progress)
    cause = environment_cause(e)
    why = machine_words(e)
    result.notes.append(f"learning check not run: {why}"
                        + (f" [cause: {cause}]" if cause else ""))
    return finish_run(result, files, learning=why if cause else None, broken=None if cause else why)


def finish_run(result: LadderResult, files: RunFiles, learning: str | None = None,
               broken: str | None = None) -> int:
    """Write, then print: a table that cannot be printed (a closed pipe) loses nothing.
    ``learning``: the machine kept the learning check from running (why); ``broken``: it
    raised for another reason (why). The exit status: 0 complete, 1 nothing measured or the
    learning check failed, ``EXIT_INCOMPLETE`` a rung or the check failed for the machine."""
    measured = any(r.measured for r in result.rungs)
    learned = (result.learning is None or result.learning.passed) and broken is None
    failed = [r for r in result.rungs if r.result_kind == "failed"]
    ok = measured and learned and not failed and learning is None
    try:
        written = files.finish(result, ok, waterfall_writer(result))
    except (OSError, ValueError) as e:     # a disk that filled up, a figure that failed
        say(text_table(result))                 # the ladder is on screen, whatever the disk did
        raise CLIError(f"nothing written: {e}" if not files.saved
                       else f"{e}; {files.saved_line()}") from e
    try:
        say(text_table(result))
        for path in written:
            say(f"wrote {path}")
    except OutputClosed as e:
        raise annotate(e, f"results written to {', '.join(map(str, written))}" if written else "")
    if ok:
        return 0
    kept = (f"; {files.target} kept as it was, this run is in {files.progress} (--overwrite replaces it)"
            if files.keep else "")
    if learned and (failed or learning):
        print(f"perfladder: incomplete: {incomplete_words(failed, learning)}; clear the cause and "
              f"{continue_words(files)}{kept}", file=sys.stderr)
        return EXIT_INCOMPLETE
    skipped = "; ".join(f"{r.name} {(r.error or 'skipped').splitlines()[0][:120]}" for r in result.rungs)
    why = (f"the learning check failed: {broken or result.learning}" if measured
           else f"no rung was measured ({skipped or 'no rung ran'})")
    print(f"perfladder: error: {why}{kept}", file=sys.stderr)
    return 1


def incomplete_words(failed, learning: str | None) -> str:
    """``'R1 failed for the machine (a compile cache entry could not be read), ...'``."""
    def why(r):
        cause = r.details.get("cause")
        words = ENVIRONMENT_CAUSES.get(cause, cause or "see its error")
        return f"{words}, in {r.details['where']}" if r.details.get("where") else words
    parts = [f"{r.name} failed for the machine ({why(r)})" for r in failed]
    if learning:
        parts.append(f"the learning check could not run: {learning}")
    return ", ".join(parts)


def continue_words(files: RunFiles) -> str:
    if files.progress is None:
        return "run it again (no --out given: nothing saved)"
    return f"continue with --resume {files.progress}"


def _read_all(values) -> list[LadderResult]:
    return [LadderResult.read(user_path(v, "results file")) for v in values]


def cmd_plot(args) -> int:
    target = check_output_path(args.output, "figure", "-o")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from perfladder.pages.plot import compare, waterfall
    results = _read_all(args.results)

    def figure(tmp):
        plt.close(waterfall(results[0], tmp) if len(results) == 1 else compare(results, tmp))
    try:
        [path] = write_all([(target, figure)])
    except (OSError, ValueError) as e:          # e.g. a ladder with no measured rung
        raise CLIError(str(e)) from e
    say(f"wrote {path}")
    return 0


def cmd_table(args) -> int:
    from perfladder.pages.plot import comparison_table
    results = _read_all(args.results)
    for r in results:
        say(text_table(r), end="\n\n")
    if len(results) > 1:
        say(comparison_table(results))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="perfladder", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"perfladder {__version__}")
    p.add_argument("--debug", action="store_true",
                   help=f"show the Python traceback of an error (also: {DEBUG_VARIABLE}=1)")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a ladder and write results JSON")
    r.add_argument("framework", help=f"one of {', '.join(FRAMEWORKS)}")
    r.add_argument("--config", default=None,
                   help=f"one of {', '.join(CONFIG_NAMES)} (default: full on a GPU, smoke on CPU)")
    r.add_argument("--rungs", default=None,
                   help="comma-separated rung names (default: all but the optional ones, e.g. torch B8)")
    r.add_argument("--out", default=None, help="results JSON path (.json)")
    r.add_argument("--png", default=None,
                   help="also save the waterfall here (.png, .pdf, .svg, ...: the suffix picks the format)")
    r.add_argument("--no-learn", action="store_true", help="skip the learning check")
    r.add_argument("--resume", default=None, metavar="JSON",
                   help="continue an earlier run of the same ladder (its rungs are kept, not re-run)")
    r.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out file even when this run measured nothing or "
                        "its checks failed (without it, such a run leaves the file as it was and "
                        "keeps its own results in NAME.partial.json)")
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.add_argument("--compile-ahead", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the expected steps before the first rung: torch in helper "
                        "processes (perfladder.ahead.torch; default: on for the full config on a "
                        "GPU), JAX in threads (perfladder.ahead.jax; default: off)")
    r.add_argument("--memory-cap-gib", default=None, metavar="GIB",
                   help="hold the run to this much device memory, as a smaller card would (the "
                        "framework's allocator is capped, and a rung predicted not to fit is "
                        "recorded as does_not_fit); also $PERFLADDER_MEMORY_CAP_GIB")
    r.set_defaults(func=cmd_run)
    pl = sub.add_parser("plot", help="waterfall PNG from results JSON (two files: side by side)")
    pl.add_argument("results", nargs="+")
    pl.add_argument("-o", "--output", required=True,
                    help="figure file (.png, .pdf, .svg, ...; no suffix: .png is added)")
    pl.set_defaults(func=cmd_plot)
    t = sub.add_parser("table", help="print results JSON as tables")
    t.add_argument("results", nargs="+")
    t.set_defaults(func=cmd_table)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        debug = debug_requested(args.debug)
    except UserError as e:
        print(f"perfladder: error: {e}", file=sys.stderr)
        return 2
    return guarded("perfladder", lambda: args.func(args), debug=debug,
                   user_errors=(CLIError, ResultsError, OutputError, CorpusError))


if __name__ == "__main__":
    sys.exit(main())
