"""The ladder engine (framework-free): how rungs chain, which are kept, and ``run_ladder``.

Each framework supplies a *lab* (its backend: device, versions, how to build a step from a
recipe, measure, profile, train) and a registry of rung declarations
(``perfladder.ladder.rung``); this module runs them:

    config -> lab -> for each rung: recipe = change(base) -> fn(lab, Given) -> Evidence
           -> RungResult (built here, once) -> LadderResult.finalize() -> kernel report -> learning

How rungs chain. A seed rung builds on the rung it names (``builds_on``), and its recipe is
that rung's recipe with its own ``change`` applied, whether or not that rung ran in this
ladder. The beyond rungs start from the lab's ``seed_top`` and build on the fastest
configuration so far: a rung is kept (the next one builds on it) when its verdict is
'faster' -- judged against both measurements' noise, and never for a measurement that did
not settle. One exception keeps a disturbed base from discarding a real fix: a settled rung
whose slowest window beats every window of a base that did not settle is kept, though its
speedup is not credited. In the smoke configuration the numbers mean nothing, so they do not
decide: every added technique is kept and a choice between implementations
(``alternative``) is not, so a smoke run always walks the same configurations. Multi-GPU
rungs run last. The last kept configuration is *the* fastest: the kernel report, the
learning check and every page read that one (``LadderResult.fastest``).

A rung whose function raises (a gate refusing the model, a kernel refusing the shape, memory
running out) becomes a loud 'skipped' entry with the error, and the ladder goes on. An
interrupt (``KeyboardInterrupt``) is not a failure of the rung: it stops the ladder.

``LadderRun.run(name, **code)`` runs one rung with the reader's own code for a technique
(``lab.code``: the functions the lab builds steps from), so a notebook cell that edits a
technique measures the edit. A rung run again replaces its entry and marks the entries that
built on the earlier one; ``--resume`` keeps final entries and runs the others again: one
rule for both (``perfladder.ladder.rerun``). An interrupted rung changes nothing: no entry,
no chain, the lab's code and the rung's change as they were.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time
import traceback
from typing import Any, Callable

from perfladder.faults import environment_failure, reraise_if_interrupt
from perfladder.hardware import achieved_tflops, rung_mfu
from perfladder.ladder import rerun
from perfladder.ladder.fit import out_of_memory_failure
from perfladder.ladder.rung import (
    Evidence,
    Given,
    NotMeasured,
    Rung,
    check_rungs,
    registry,
)
from perfladder.measure.counts import check_mfu
from perfladder.measure.gates import ReceiptError
from perfladder.measure.timing import Stopwatch, measure_settled
from perfladder.measure.verdict import above_unsettled_base
from perfladder.results.record import LadderResult, RungResult

__all__ = ["Chain", "LadderRun", "Rung", "check_rungs", "registry", "keeps", "run_rung",
           "run_ladder", "record", "measure_settled"]


def keeps(rung: Rung, res: RungResult, smoke: bool) -> bool:
    """The one keep rule of both ladders (see the module docstring)."""
    if not res.measured:
        return False
    if smoke:
        return not rung.alternative
    return bool(res.verdict) and (res.verdict["verdict"] == "faster" or above_unsettled_base(res.verdict))


class Chain:
    """Which configuration each rung builds on, as the ladder runs."""

    def __init__(self, rungs: dict[str, Rung], lab):
        self.rungs, self.lab = rungs, lab
        self.fastest: tuple[str, Any] | None = None     # beyond: (name, recipe) to build on
        self.recipes: dict[str, Any] = {}                # what each measured rung ran

    def recipe_of(self, name: str):
        """The recipe rung ``name`` ran, or the one its declaration implies."""
        if name in self.recipes:
            return self.recipes[name]
        r = self.rungs[name]
        base = self.lab.seed_recipe() if r.builds_on is None else self.recipe_of(r.builds_on)
        return base if r.change is None else r.change(base, self.lab.config)

    def base(self, rung: Rung, again: bool = False) -> tuple[str | None, Any]:
        """What ``rung`` builds on; ``again``: it has an entry already, and a rung on the chain's
        top then builds on the top as it stood before that entry (``rerun.top``)."""
        if again and rung.stage != "seed" and rung.builds_on is None:
            name = rerun.top(self.lab.result, self.recipes.__contains__, self.lab.seed_top, rung.name)
            return name, self.recipe_of(name)
        if rung.stage == "seed":
            base = rung.builds_on
            recipe = self.lab.seed_recipe() if base is None else self.recipe_of(base)
        elif rung.builds_on is not None:            # a multi-GPU rung of a named seed rung
            base, recipe = rung.builds_on, self.recipe_of(rung.builds_on)
        else:
            base, recipe = self.top()
        return base, recipe

    def top(self) -> tuple[str, Any]:
        if self.fastest is None:
            return self.lab.seed_top, self.recipe_of(self.lab.seed_top)
        return self.fastest

    def settle(self, result: LadderResult) -> None:
        """The top read again from the entries once a rung built on it has one (``rerun.top``)."""
        if self.fastest is not None or any(rerun.on_top(self.rungs, r) for r in result.rungs):
            name = rerun.top(result, self.recipes.__contains__, self.lab.seed_top)
            self.fastest = (name, self.recipe_of(name))


def record(rung: Rung, given: Given, ev: Evidence, lab) -> RungResult:
    """The one place a ``RungResult`` is made from a rung's evidence and its declaration."""
    recipe = ev.recipe if ev.recipe is not None else given.recipe
    precision = lab.precision(recipe)
    # the number is recorded under the precision the recipe computes in: the timed step's own
    # receipt must show it (a control that claims bf16 and computes fp32, R2a, is recorded fp32)
    if ev.receipt is not None and not dataclasses.replace(ev.receipt, claimed=precision).ok:
        raise ReceiptError(f"{rung.name} claims {precision} but its timed step computed in "
                           f"{ev.receipt.observed}: not recording that number as {precision}",
                           gate="receipt")
    t = ev.timing
    rate = statistics.median(t.settled_windows)
    B, T = (t.batch_shape or [recipe.batch_size, lab.config.num_steps])[:2]
    fpt = lab.flops_per_token(T)
    per_device = rate / max(1, ev.devices)
    return check_mfu(RungResult(
        name=rung.name, key=rung.key, label=rung.label, tokens_per_s=rate, kind=rung.kind,
        stage=rung.stage, precision=precision, batch_size=B, seq_len=T, builds_on=given.base_name,
        recipe=recipe.to_dict(), timing=t, tflops=achieved_tflops(rate, fpt),
        **rung_mfu(per_device, fpt, lab.device_name, precision),
        memory=ev.memory, compile=ev.compile, gates=list(ev.gates), receipt=ev.receipt,
        profile=ev.profile, prediction=ev.prediction, details=dict(ev.details),
        notes=list(ev.notes), section=rung.section, outcome="measured"), lab.device_name, ev.devices)


def failed(rung: Rung, lab, base: str | None, recipe, error: str, tb: str = "", *,
           details: dict | None = None, prediction=None, loud: bool = True,
           outcome: str = "error") -> RungResult:
    """The 'skipped' entry of a rung that measured nothing (said on stderr unless it chose not
    to measure)."""
    if loud:
        print(f"perfladder: {lab.framework} {rung.name} ({rung.label}) not measured: {error}",
              file=sys.stderr, flush=True)
    details = dict(details or {})
    if tb:
        details["traceback"] = tb[-4000:]
    return RungResult(name=rung.name, key=rung.key, label=rung.label, kind="skipped",
                      stage=rung.stage, builds_on=base,
                      recipe=recipe.to_dict() if recipe is not None else {},
                      precision=getattr(recipe, "precision", None) or "fp32",
                      error=error[:3000], section=rung.section, details=details,
                      prediction=prediction, outcome=outcome)


def run_rung(rung: Rung, lab, chain: Chain) -> RungResult:
    """Build the rung's recipe on its base, run it (failures become skipped rungs), record it
    (in place of its earlier entry, if it has one: ``rerun``)."""
    base, base_recipe = chain.base(rung, again=rerun.entry(lab.result, rung.name) is not None)
    recipe = base_recipe
    t0, watch = time.perf_counter(), Stopwatch()
    try:
        if rung.change is not None:
            recipe = rung.change(base_recipe, lab.config)
        given = Given(rung=rung, recipe=recipe, base_name=base, base_recipe=base_recipe,
                      base=_ran(lab.result, base), watch=watch)
        if rung.needs_gpu and not lab.on_gpu:
            res = failed(rung, lab, base, recipe, f"not applicable on CPU: {rung.needs_gpu}",
                         outcome="not_applicable")
        else:
            admit = getattr(lab, "admit", None)   # can the card compute, run and hold it?
            if admit is not None:                 # (NotSupported / NotApplicable / DoesNotFit)
                admit(rung, given)
            res = record(rung, given, rung.fn(lab, given), lab)
    except NotMeasured as e:
        res = failed(rung, lab, base, e.recipe or recipe, e.reason, details=e.details,
                     prediction=e.prediction, loud=False, outcome=e.outcome)
    except Exception as e:     # the ladder goes on; the entry says what happened ...
        reraise_if_interrupt(e)    # ... unless the user stopped it: an interrupt is never a skip
        oom = out_of_memory_failure(e, getattr(recipe, "batch_size", None))
        if oom:        # a property of the card: one line, no traceback kept
            res = failed(rung, lab, base, recipe, oom.pop("error"), **oom)
        else:
            res = failed(rung, lab, base, recipe, f"{type(e).__name__}: {e}", traceback.format_exc(),
                         **environment_failure(e))
    finally:
        lab.free()
    # a rung that failed says where its time went up to the failure, as a measured one does
    res.details.setdefault("seconds", dict(watch.seconds))["total"] = time.perf_counter() - t0
    ran = lab.recipe_from_dict(res.recipe) if res.measured and res.recipe else recipe
    with rerun.uninterrupted():            # recorded whole, or (an interrupt before) not at all
        commit(rung, res, lab, chain, base, ran)
    return res


def commit(rung: Rung, res: RungResult, lab, chain: Chain, base: str | None, recipe) -> None:
    """Record ``res`` (``rerun.put``), what later rungs build on (the chain) and, for a rung run
    again, the marks of the entries that built on its earlier version (``rerun.mark``)."""
    earlier = rerun.put(lab.result, res, chain.rungs, base)
    if res.measured:
        chain.recipes[rung.name] = recipe
    else:
        chain.recipes.pop(rung.name, None)
    if rung.stage == "beyond":
        res.kept = keeps(rung, res, lab.config.is_smoke)
    if earlier is not None:
        rerun.mark(lab.result, chain.rungs, res, earlier)
    chain.settle(lab.result)
    if lab.result.fastest is not None:       # the kernel report or learning check named one
        fastest(lab, chain)


def _ran(result: LadderResult, name: str | None) -> RungResult | None:
    if name is None:
        return None
    try:
        r = result.rung(name)
    except KeyError:
        return None
    return r if r.measured else None


class LadderRun:
    """One ladder on one lab, run rung by rung (a notebook cell per rung) or all at once
    (``run_ladder``). ``result`` is the growing ``LadderResult``."""

    def __init__(self, lab, rungs: dict[str, Rung], resume: LadderResult | None = None):
        # this ladder's own copy: a cell may hand a rung another recipe change (``run``)
        self.rungs = dict(rungs)
        self.lab, self.chain = lab, Chain(self.rungs, lab)
        if resume is not None:
            self._resume(resume)

    def _resume(self, earlier: LadderResult) -> None:
        """Continue ``earlier`` (a results file of the same framework and config): its rungs
        stay as measured, the chain picks up from its recipes and its last kept beyond rung."""
        lab = self.lab
        if earlier.framework != lab.framework or earlier.config.get("name") != lab.config.name:
            raise ValueError(f"cannot continue a {earlier.framework} {earlier.config.get('name')!r} "
                             f"run with a {lab.framework} {lab.config.name!r} ladder")
        cap, earlier_cap = lab.result.memory_cap_gib, earlier.memory_cap_gib
        if cap != earlier_cap:     # which rungs fit was decided under the earlier cap
            def said(c):
                return "no memory cap" if c is None else f"a memory cap of {c:g} GiB"
            raise ValueError(f"cannot continue a run made under {said(earlier_cap)} with {said(cap)}; "
                             "valid: the same cap as the earlier run, or a new run without --resume")
        earlier.notes += [f"continued by: {lab.result.command or 'a later run'}", *(  # and its own settings
            f"the continuing run: {n}" for n in lab.result.notes if n not in earlier.notes)]
        lab.result = earlier
        for r in earlier.rungs:
            if r.measured and r.recipe and r.name in self.rungs:
                self.chain.recipes[r.name] = lab.recipe_from_dict(r.recipe)
        self.chain.settle(earlier)

    @property
    def result(self) -> LadderResult:
        return self.lab.result

    def run(self, name: str, change: Callable | None = None, **code: Callable) -> RungResult:
        """Run rung ``name`` (in any order the caller likes; its base is what ran so far).

        ``code``: technique functions to build this and every later step from, by name (the
        lab's ``code``; e.g. ``compile_model=...``), so an edited notebook cell is measured.
        ``change(recipe, config) -> recipe``: what this rung changes in the recipe it builds on,
        in place of its declaration's (the page shows each rung's change in its cell).
        A rung that ran already runs again and its entry is replaced (``rerun``); an interrupt
        leaves the ladder, its chain, the lab's code and the rung's change as they were."""
        check_rungs(self.rungs, [name])
        if change is not None and not callable(change):
            raise ValueError(f"change={change!r} is not valid; valid: a function "
                             "change(recipe, config) -> recipe")
        declared, code_before = self.rungs[name], rerun.code_of(self.lab)
        try:
            if change is not None:
                self.rungs[name] = dataclasses.replace(declared, change=change)
            self.lab.use(**code)
            return run_rung(self.rungs[name], self.lab, self.chain)
        except BaseException:        # an interrupt: nothing measured, so nothing changes
            self.rungs[name] = declared
            rerun.restore_code(self.lab, code_before)
            raise

    def fastest(self) -> tuple[str, Any]:
        return fastest(self.lab, self.chain)

    def kernel_report(self) -> dict | None:
        return kernel_report(self.lab, self.chain)

    def learning_check(self):
        return learning_check(self.lab, self.chain)

    def __repr__(self) -> str:
        return (f"LadderRun({self.lab.framework}, {self.lab.config.name}, {self.lab.device_name}, "
                f"ran={[r.name for r in self.result.rungs]})")


def run_ladder(lab, rungs: dict[str, Rung], names=None, *, learn: bool = True, progress=None,
               optional: bool = False, kernels: bool = True,
               resume: LadderResult | None = None, checkpoint=None) -> LadderResult:
    """Run ``names`` (default: every non-optional rung) of ``rungs`` on ``lab`` in ladder order,
    then the kernel report of the fastest configuration (when beyond rungs ran), then the
    learning check of that configuration. ``progress(event, name, payload)`` hears
    ``('start', name, None)`` and ``('end', name, RungResult | LearningCheck)``. ``resume``:
    an earlier result of the same ladder to continue: its final entries are kept, a failed
    one is retried and the entries built on its earlier version run again (``rerun.again``).
    ``checkpoint(result)`` is handed the growing ``LadderResult`` after every rung, the kernel
    report and the learning check, so a caller can save it as the ladder goes (an interrupt
    then loses only the rung in flight); what it raises stops the ladder."""
    order = check_rungs(rungs, names, optional=optional)
    run = LadderRun(lab, rungs, resume=resume)

    def step(name, thunk):
        if progress:
            progress("start", name, None)
        out = thunk()
        if progress:
            progress("end", name, out)
        return out

    def saved():
        if checkpoint is not None:
            checkpoint(run.result)

    ran = []
    for name in order:                  # read as it goes: a retried rung marks the later ones
        why = rerun.again(rerun.entry(run.result, name))
        if why is None:
            continue
        if why:
            print(f"perfladder: {lab.framework}: {why}", file=sys.stderr, flush=True)
        step(name, lambda name=name: run.run(name))
        ran.append(name)
        saved()
    if kernels and any(rungs[n].stage == "beyond" for n in ran):
        run.kernel_report()
        saved()
    if learn:
        step("learning", run.learning_check)
        saved()
    return run.result.finalize()


def fastest(lab, chain: Chain) -> tuple[str, Any]:
    """The configuration the kernel report and the learning check use, recorded as the result's
    ``fastest``: the chain's top once beyond rungs ran; else the fastest settled seed waterfall
    rung (smoke: ``seed_top``, since its numbers decide nothing); else ``seed_top``'s recipe."""
    if chain.fastest is not None:
        name, recipe = chain.fastest
    else:
        ran = [r for r in lab.result.waterfall() if r.name in chain.recipes and r.stable is not False]
        if ran and not lab.config.is_smoke:
            name = max(ran, key=lambda r: r.tokens_per_s).name
            recipe = chain.recipes[name]
        else:
            name, recipe = lab.seed_top, chain.recipe_of(lab.seed_top)
    # recorded only when measured here: a chain whose top failed (or was not in this run)
    # still reports and trains on its recipe, but a page names a measured rung
    lab.result.fastest = name if any(r.name == name and r.measured for r in lab.result.rungs) else None
    return name, recipe


def kernel_report(lab, chain: Chain) -> dict | None:
    """The kernel breakdown of the fastest configuration, stored under that name in the result
    (``LadderResult.kernel_reports``); a profiler failure costs the report, not the ladder."""
    name, recipe = fastest(lab, chain)
    t0 = time.perf_counter()
    try:
        report = lab.kernel_report(name, recipe)
        report["seconds"] = time.perf_counter() - t0
    except Exception as e:
        reraise_if_interrupt(e)
        msg = f"{type(e).__name__}: {e}"[:2000]
        lab.result.notes.append(f"kernel breakdown of {name} failed: {msg}")
        print(f"perfladder: {lab.result.notes[-1]}", file=sys.stderr, flush=True)
        lab.result.attach_kernels(name, None, error=msg)
        return None
    finally:
        lab.free()
    lab.result.attach_kernels(name, report)
    return report


def learning_check(lab, chain: Chain):
    """Train the fastest configuration from a fresh init; the check is stored on the result."""
    name, recipe = fastest(lab, chain)
    t0, watch = time.perf_counter(), Stopwatch()
    try:
        check = lab.learning_check(name, recipe, watch=watch)
    finally:
        lab.free()
    check.seconds = time.perf_counter() - t0
    check.phases = dict(watch.seconds)
    check.configuration = name
    lab.result.learning = check
    return check
