"""What a ladder notebook's cells call (framework-free: the framework is imported by name).

    page = LadderPage("torch")          # picks the configuration, builds the ladder, shows the header
    page.run("R1", compile_model=compile_model)   # runs R1 with the cell's code, shows its result
    page.waterfall(); page.roofline(); page.memory(); page.timeline()
    page.kernel_report(); page.learning_check(); page.glue(); page.save()

Each rung's cell holds the code of its technique and passes it to ``run``, so a reader who
edits the cell measures the edit. On a GPU the page runs the full ladder and shows this
build's own numbers. Without one it runs the smoke ladder live, as a check of the code (one
folded line per rung, labelled "smoke check, not a performance number"), and shows the committed reference run (``results.committed.reference_run()``)
rung by rung, labelled with its device and date. ``page.shown`` is the ladder whose numbers
the page shows; ``page.live`` the one this build ran. The prose between the cells is the
authors'; ``glue`` inserts its numbers and the verdicts of its checked claims
(``perfladder.pages.story``, ``perfladder.pages.chapter``) computed from ``shown``.

Every cell can be run again. A rung's cell run again measures the cell's code again, shows
the new rate beside the one it replaced (and the reference run's), and the rungs built on the
earlier version are marked until their cells run again (``perfladder.ladder.rerun``); the
table, the waterfall, ``glue`` and ``save`` say so (``perfladder.pages.rerun``). An
interrupted cell leaves the ladder as it was before the cell.
"""
from __future__ import annotations

import contextlib
import importlib
import io
from pathlib import Path

from perfladder.book.paths import build_results_dir
from perfladder.config import pick_config
from perfladder.pages import cards, kernel_report, multigpu, plot, report, rerun
from perfladder.pages.chapter import checks_for, numbers_for, texts_for
from perfladder.pages.claims import is_smoke
from perfladder.pages.glossary import href, link_terms
from perfladder.pages.narrative import SMOKE_LABEL, learning_text, smoke_check, smoke_summary
from perfladder.pages.report import (
    box_html,
    display_html,
    esc,
    fold_html,
    header_display,
    paragraphs_html,
    run_label,
)
from perfladder.pages.story import glue_values
from perfladder.results import ResultsError
from perfladder.results.committed import MULTI_GPU_RUN, read_run, reference_run
from perfladder.results.record import FRAMEWORKS, LadderResult
from perfladder.words import rate


def _show_figure(fig) -> None:
    import matplotlib.pyplot as plt
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(fig)
    plt.close(fig)


def _glue(key: str, markdown: str, as_text: bool = False) -> None:
    """``myst_nb.glue`` of a markdown value (``as_text``: a plain string, for a text page's
    ``{glue:text}``), not displayed; a no-op outside a notebook kernel."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown
        from myst_nb import glue
    except ImportError:
        return
    if get_ipython() is not None:
        glue(key, markdown if as_text else Markdown(markdown), display=False)


class LadderPage:
    """One framework's ladder page (see the module docstring).

    ``config``: a ``LadderConfig`` (default: ``pick_config``: full on a GPU, smoke otherwise).
    ``module`` / ``run`` / ``reference``: the framework package, a ``LadderRun`` and the
    reference ``LadderResult`` to use instead of importing, building and reading them (tests
    pass stubs). ``show_header``: display the header box at once.
    """

    def __init__(self, framework: str, config=None, *, module=None, run=None,
                 reference: LadderResult | None = None, show_header: bool = True):
        if framework not in FRAMEWORKS:
            raise ValueError(f"framework={framework!r} is not valid; valid choices: {FRAMEWORKS}")
        self.framework = framework
        self.fw = module if module is not None else importlib.import_module(f"perfladder.{framework}")
        self.config = config if config is not None else pick_config(has_gpu=self.fw.has_gpu())
        self.ladder = run if run is not None else self.fw.Ladder(
            self.config, command=f"perfladder.pages.ladder.LadderPage({framework!r}) in a book build")
        self.reference, self.reference_source, self.reference_error = reference, "", ""
        if self.config.is_smoke and reference is None:
            try:
                folder = reference_run(framework=framework)
                self.reference = read_run(folder / f"{framework}.json")
                self.reference_source = f"benchmarks/results/{folder.name}/{framework}.json"
            except (FileNotFoundError, ValueError, ResultsError) as e:
                self.reference_error = str(e)
        self.glued: dict[str, str] = {}
        self._header: tuple[str, str] | None = None      # (html, text) as first shown
        self._header_note = ""
        self.linked: set[str] = set()      # glossary terms this page's outputs have linked
        self.linked_folded: set[str] = set()   # ... and those linked inside folds (their own set)
        self.multi_gpu_said = False        # the committed multi-GPU run named once on the page
        if show_header:
            self.header()

    # -- which ladder is shown --------------------------------------------------------------
    @property
    def live(self) -> LadderResult:
        return self.ladder.result

    @property
    def shown(self) -> LadderResult:
        """The reference run on a smoke build (when it could be read); else this build's ladder."""
        return self.reference if self.config.is_smoke and self.reference is not None else self.live

    @property
    def plan(self) -> list:
        """The rung declarations in ladder order."""
        return list(self.fw.RUNGS.values())

    def _shown_rung(self, name: str):
        """The shown ladder's rung for declaration ``name``: by technique key, else by name."""
        decl = self.fw.RUNGS.get(name)
        if decl is not None and self.shown.by_key(decl.key) is not None:
            return self.shown.by_key(decl.key)
        try:
            return self.shown.rung(name)
        except KeyError:
            return None

    # -- cells -------------------------------------------------------------------------------
    def header(self) -> None:
        self._header = self._header_box()
        header_display(*self._header, display_id=f"perfladder-header-{id(self)}")

    def _header_box(self) -> tuple[str, str]:
        device = self.live.device
        if not self.config.is_smoke:
            plain = report.banner_text(self.config, device).replace("**", "").replace("`", "")
            return report.banner_html(self.config, device), plain
        if self.reference is not None:
            shows = ("Every other number, table and figure comes from the committed reference run ("
                     f"{self.reference.device}, {self.reference.created[:10]}).")
        else:
            shows = (f"No committed reference run could be read ({self.reference_error}), so the page shows "
                     "the smoke run itself: its numbers are not performance results.")
        text = (f"This build runs the tiny smoke configuration on {device}: each cell runs its code live, "
                f"as a check; those numbers are NOT performance results, each folded under a line "
                f"'{SMOKE_LABEL}'. {shows}")
        full = ("" if self.reference is None else
                fold_html("the reference run in full", f'<p style="font-size: 0.85em;">'
                          f'{esc(run_label(self.reference, self.reference_source))}</p>'))
        return (link_terms(box_html("Smoke run: not performance numbers",
                                    f'<p style="margin: 0;">{esc(text)}</p>{full}', "warning",
                                    cls="perfladder-banner"), self.linked, self.linked_folded),
                "=" * 78 + "\n" + text + "\n" + "=" * 78)
    def _note_in_header(self) -> None:
        """Once a cell has run again, the header at the top of the page says which rungs were run
        again and which stand on an earlier version (updated in place in a kernel)."""
        note = rerun.ladder_note(self.live)
        if self._header is None or note == self._header_note:
            return
        self._header_note = note
        html_text, text = self._header
        if note:
            html_text += box_html("Rungs run again in this session", f'<p style="margin: 0;">{esc(note)}</p>',
                                  "warning", cls="perfladder-rerun")
            text += "\n" + note
        header_display(html_text, text, display_id=f"perfladder-header-{id(self)}", update=True)

    def run(self, name: str, **code) -> None:
        """Run rung ``name`` live with the cell's ``code`` (technique functions by name), then show
        the shown ladder's result for it (this build's own is ``page.live.rung(name)``)."""
        with self._quiet() as said:
            res = self.ladder.run(name, **code)
        self._keep_partial()
        self.show(name, res, said.getvalue())
        self._note_in_header()

    def _keep_partial(self) -> None:
        """On a full build, the ladder so far in ``<framework>.partial.json`` after every rung: a
        build stopped part-way (a time limit, a crash) still leaves the rungs it measured."""
        if not self.config.is_smoke:
            self.live.write(build_results_dir() / f"{self.framework}.partial.json")

    @contextlib.contextmanager
    def _quiet(self):
        """On a smoke build, what the live run prints (the engine's notes on stderr, R5's
        predictions for the CPU processes) is smoke output: kept for the folded smoke line
        instead of printed beside the reference's numbers. A full build prints it as it comes."""
        said = io.StringIO()
        if not (self.config.is_smoke and self.reference is not None):
            yield said
            return
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            yield said

    def show(self, name: str, res=None, said: str = "") -> None:
        """The shown ladder's result for rung ``name`` (after the smoke check of ``res``, and
        ``said``: what its live run printed)."""
        if not self.config.is_smoke or self.reference is None:
            self._display(cards.rung_html(self.live, name), cards.rung_text(self.live, name))
            if not self.live.rung(name).measured:
                self._committed_multi_gpu(name)
            return
        if res is not None:
            self._smoke_box("", "\n".join(t for t in (smoke_check(res), self._rerun_text(res),
                                                      said.strip()) if t))
        ref = self._shown_rung(name)
        if ref is None:
            decl = self.fw.RUNGS.get(name)
            text = (f"The reference run ({self.reference.device}, {self.reference.created[:10]}) has no rung for "
                    f"this technique ({decl.key if decl else name}): it was recorded before the rung existed.")
            if multigpu.measurements(self.framework, name):
                # a single-GPU ladder never measures R5; the committed multi-GPU run did
                text = (f"The single-GPU reference ladder ({self.reference.device}, {self.reference.created[:10]}) "
                        "does not measure data parallelism; the committed multi-GPU run does.")
            self._display(paragraphs_html([text]), text)
            self._committed_multi_gpu(name)
            return
        label = f"Reference run: {self.reference.device}, {self.reference.created[:10]}"
        self._display(cards.rung_html(self.reference, ref.name, label),
                     cards.rung_text(self.reference, ref.name, label))
        if not ref.measured:
            self._committed_multi_gpu(name)

    def _rerun_text(self, res) -> str:
        """A smoke check's words for a rung run again (beside the reference run's rate) or built
        on an earlier version of one."""
        ref = self._shown_rung(res.name)
        where = f"{self.reference.device}, {self.reference.created[:10]}"
        mark = f"It is {rerun.mark_text(res)}." if res.built_on_earlier else ""
        return " ".join(t for t in (rerun.compare_line(res, ref, where), mark) if t)

    def rerun_note(self) -> str:
        """Show which rungs of this session's ladder were run again and which are built on an
        earlier version of one (nothing when every rung ran once); the words shown."""
        text = rerun.ladder_note(self.live)
        if text and self.config.is_smoke and self.reference is not None:
            self._smoke_box("the cells run again in this session", text)
        elif text:
            display_html(box_html("Rungs run again", f'<p style="margin: 0;">{esc(text)}</p>', "warning",
                                  cls="perfladder-rerun"), text)
        return text

    def _committed_multi_gpu(self, name: str) -> None:
        """A multi-GPU rung this page cannot show measured: the committed run's numbers."""
        rows = multigpu.measurements(self.framework, name)
        if not rows:
            return
        where = f"{rows[0].get('device') or 'two GPUs'} x{rows[0]['k']} {multigpu.joined_by(rows[0])}"
        text = (f"Measured on {where} (benchmarks/results/{MULTI_GPU_RUN}), each prediction written before "
                "its launch:")
        summary = "the measurements, each beside its prediction"
        if self.multi_gpu_said:          # the run was named at the first multi-GPU rung: only its table
            self._display(fold_html(f"{summary} (measured on {where})", multigpu.table_html(rows)),
                          text + "\n" + multigpu.table_text(rows))
            return
        self.multi_gpu_said = True
        self._display(paragraphs_html([text]) + fold_html(summary, multigpu.table_html(rows)),
                      text + "\n" + multigpu.table_text(rows))

    def _display(self, html_text: str, text: str) -> None:
        """``display_html`` with the first mention of each glossary term on the page linked."""
        display_html(link_terms(html_text, self.linked, self.linked_folded), text)

    def _smoke_box(self, what: str, text: str) -> None:
        """One folded line: what ran where, labelled as no result; the check behind it."""
        summary = smoke_summary(what, self.live.device)
        body = "<br>".join(esc(line) for line in text.splitlines())
        self._display(fold_html(summary, f'<p style="margin: 0; font-size: 0.9em; color: #555;">{body}</p>',
                                "perfladder-smoke"), f"[{summary}] {text}")

    def table(self) -> None:
        """Every rung of the shown ladder, one row each (folded: the waterfall above draws it)."""
        self._display(fold_html("every rung in one table: tokens/s, ratio to its base, regime, TFLOP/s, memory",
                                report.ladder_table_html(self.shown)), report.text_table(self.shown))
        self.rerun_note()

    def waterfall(self) -> None:
        """The shown ladder's waterfall."""
        _show_figure(plot.waterfall(self.shown))
        self.rerun_note()

    def kernel_report(self) -> None:
        """Profile the fastest configuration kernel by kernel (live), show the shown ladder's."""
        with self._quiet() as said:
            live = self.ladder.kernel_report()
        if self.config.is_smoke and self.reference is not None:
            self._smoke_box("the kernel breakdown",
                            "the kernel breakdown ran: " + (f"{len(live.get('top', []))} top operators sorted"
                                                             if live else "it failed (see the notes)")
                            + (f"\n{said.getvalue().strip()}" if said.getvalue().strip() else ""))
        r = kernel_report.kernel_rung(self.shown)
        if r is None:
            text = "No kernel breakdown was recorded in this ladder: " + "; ".join(
                n for n in self.shown.notes if "kernel breakdown" in n)
            self._display(paragraphs_html([text]), text)
            return
        title = f"{r.name} ({r.label}), the fastest configuration"
        tried = kernel_report.tried_against(self.shown, self.fw.RUNGS)
        names = (f'<p style="font-size: 0.85em;">What the kernels\' names say (<code>nvjet</code>, '
                 f'<code>splitK</code>, <code>triton_</code>, <code>fusion</code>): '
                 f'<a href="{href("kernel names")}">the glossary</a>.</p>')
        self._display(fold_html(f"{title}: its kernels by kind and by name, and the roofline table",
                                names + kernel_report.kernel_html(r.kernels, title, tried)),
                     kernel_report.kernel_text(r.kernels, title, tried))

    def learning_check(self) -> None:
        """Train the fastest configuration (live); show the shown ladder's check, its loss curve,
        validation points and threshold."""
        from perfladder.pages.figures import learning
        with self._quiet() as said:
            live = self.ladder.learning_check()
        if self.config.is_smoke and self.reference is not None:
            self._smoke_box("the learning check", learning_text(live)
                            + (f"\n{said.getvalue().strip()}" if said.getvalue().strip() else ""))
        check = self.shown.learning
        self._display(paragraphs_html([learning_text(check)]), learning_text(check))
        if check is not None and check.losses:
            title = (f"{self.shown.framework} on {self.shown.device}: {check.configuration or 'fastest'} "
                     "configuration" + (" [SMOKE]" if is_smoke(self.shown) else ""))
            _show_figure(learning.figure(check, title))

    def compiler_accounting(self, asked: dict, name: str) -> None:
        """The compiled step's own FLOP and memory accounting (``asked``: see
        ``perfladder.pages.compiler_view``) beside what the shown run recorded for rung ``name``
        against its measured rate. On a smoke build ``asked`` is of the smoke model: labelled so."""
        from perfladder.pages import compiler_view
        where = f"{self.config.name} model on {self.live.device}"
        label = (f"This build's compiled step ({where}; {SMOKE_LABEL})" if self.config.is_smoke
                 else f"This build's compiled step ({where})")
        shown = f"{name} as the run shown recorded it ({self.shown.device})"
        if self.config.is_smoke:
            self._display(compiler_view.html(None, "", self.shown, name, shown)
                          + fold_html(smoke_summary("this build's compiled step, asked", self.live.device),
                                      compiler_view.html(asked, label, None, name, "")),
                          compiler_view.text(asked, label, self.shown, name, shown))
            return
        self._display(compiler_view.html(asked, label, self.shown, name, shown),
                      compiler_view.text(asked, label, self.shown, name, shown))

    # -- figures of the shown run ------------------------------------------------------------
    def roofline(self) -> None:
        """Every rung, and every kernel group of the fastest step, on the run's measured ceilings."""
        from perfladder.pages.figures import roofline
        _show_figure(roofline.figure(self.shown))

    def memory(self) -> None:
        """Per rung: weights, gradients, AdamW moments and activations computed, beside measured."""
        from perfladder.pages.figures import memory
        _show_figure(memory.figure(self.shown))

    def timeline(self) -> None:
        """One step, device and host, at the small batch, the big one and the fastest's."""
        from perfladder.pages.figures import timeline
        _show_figure(timeline.figure(self.shown))

    def glue(self) -> dict[str, str]:
        """Insert the prose's numbers and the verdicts of its checked claims, all computed from
        the shown ladder (``perfladder.pages.chapter``); each also as plain text under
        ``<framework>_<key>`` for other pages (the exercises' solutions). Returns what was glued."""
        self.glued = glue_values(self.shown, checks_for(self.framework), numbers_for(self.framework))
        for key, value in self.glued.items():
            _glue(key, value)
            _glue(f"{self.framework}_{key}", value, as_text=True)   # pastable from other pages
        self.rerun_note()
        for key, value in texts_for(self.framework, self.shown).items():   # pasted by the text pages
            _glue(key, value, as_text=True)
        return self.glued

    def save(self, folder: str | Path | None = None) -> tuple[Path, Path]:
        """Write this build's ladder (not the reference) and its waterfall into the build's
        results folder, for the comparison page: ``<framework>.json``, ``<framework>_waterfall.png``."""
        folder = Path(folder) if folder is not None else build_results_dir()
        path = self.live.finalize().write(folder / f"{self.framework}.json")
        png = folder / f"{self.framework}_waterfall.png"
        import matplotlib.pyplot as plt
        plt.close(plot.waterfall(self.live, png))
        best = self.live.fastest_rung() if self.live.waterfall() else None
        line = f"wrote {path} and {png}" + (f" (fastest: {best.name}, {rate(best.tokens_per_s)} tokens/s)"
                                            if best else "")
        said = "; ".join(t for t in (line, cards.time_spent(self.live), rerun.ladder_note(self.live)) if t)
        if self.config.is_smoke:
            self._smoke_box("this build's own ladder", said)
        else:
            print(said)
        return path, png
