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
import shlex
import sys
import time

from perfladder import __version__
from perfladder.config import CONFIG_NAMES, pick_config
from perfladder.outputs import OutputError, check_output_path, write_all
from perfladder.results.record import FRAMEWORKS, LadderResult, ResultsError


class CLIError(ValueError):
    pass


def parse_rungs(text: str | None, valid: list[str]) -> list[str] | None:
    """``'R0,R1'`` -> ``['R0', 'R1']``; unknown names are an error listing the valid ones."""
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise CLIError(f"--rungs {text!r} names no rung; valid choices: {', '.join(valid)}")
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise CLIError(f"unknown rung(s) {', '.join(map(repr, unknown))}; valid choices: {', '.join(valid)}")
    return names


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


def write_run_outputs(result: LadderResult, json_path, figure_path) -> list:
    """Write the results JSON and the waterfall together: both or neither."""
    writers = []
    if figure_path is not None:
        def figure(tmp):
            import matplotlib.pyplot as plt

            from perfladder.pages.plot import waterfall
            plt.close(waterfall(result, tmp))
        writers.append((figure_path, figure))
    if json_path is not None:
        writers.append((json_path, result.write))
    try:
        return write_all(writers)
    except (OSError, ValueError) as e:   # e.g. a disk that filled up, a ladder with no bars
        raise CLIError(f"nothing written: {e}") from e


def cmd_run(args) -> int:
    json_path, figure_path = run_outputs(args.out, args.png)
    if args.framework not in FRAMEWORKS:
        raise CLIError(f"framework {args.framework!r} is not valid; valid choices: {FRAMEWORKS}")
    if args.config is not None and args.config not in CONFIG_NAMES:
        raise CLIError(f"--config {args.config!r} is not valid; valid choices: {', '.join(CONFIG_NAMES)}")
    try:
        fw = importlib.import_module(f"perfladder.{args.framework}")
    except ImportError as e:
        raise CLIError(f"perfladder.{args.framework} cannot be imported ({e}); "
                       f"is {args.framework} installed in this python ({sys.executable})?") from e
    rungs = parse_rungs(args.rungs, list(fw.RUNGS))
    try:
        cfg = pick_config(args.config, has_gpu=fw.has_gpu())
    except ValueError as e:          # e.g. a bad $PERFLADDER_CONFIG
        raise CLIError(str(e)) from e
    from perfladder.ladder.engine import check_rungs
    names = check_rungs(fw.RUNGS, rungs)              # optional rungs only when named
    if args.no_learn:     # said even with --quiet: the only runtime guard of the targets is off
        print("perfladder: --no-learn: no learning check; targets shifted against their inputs "
              "(which every gate passes) go unchecked in this run", file=sys.stderr, flush=True)
    progress = None if args.quiet else Progress(len(names) + (0 if args.no_learn else 1))
    command = "perfladder " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    earlier = None if args.resume is None else LadderResult.read(args.resume)
    result = fw.run_ladder(cfg, rungs=names, learn=not args.no_learn, progress=progress,
                           command=command, resume=earlier)
    print(result.table())
    failed = result.learning is not None and not result.learning.passed
    for path in write_run_outputs(result, json_path, figure_path):
        print(f"wrote {path}")
    if failed:
        print(f"perfladder: error: the learning check failed: {result.learning}", file=sys.stderr)
        return 1
    return 0


def _read_all(paths) -> list[LadderResult]:
    return [LadderResult.read(p) for p in paths]


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
    print(f"wrote {path}")
    return 0


def cmd_table(args) -> int:
    from perfladder.pages.plot import comparison_table
    results = _read_all(args.results)
    for r in results:
        print(r.table(), end="\n\n")
    if len(results) > 1:
        print(comparison_table(results))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="perfladder", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"perfladder {__version__}")
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
    r.add_argument("--quiet", action="store_true", help="no progress lines")
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
        return args.func(args)
    except (CLIError, ResultsError, OutputError) as e:
        print(f"perfladder: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
