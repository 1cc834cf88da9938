"""The ladder engine (framework-free): rung declarations, the registry, and ``run_ladder``.

A rung is declared once, as a ``Rung``: its display ``name`` in one framework ("R1", "B4"),
a technique ``key`` shared by both frameworks ("compile", "onehot_embedding"), a bar
``label``, the ``change`` it makes to the configuration it builds on (a recipe), what proves
it computes the same model (``gate``), the chapter section whose tool it applies, and the
function that builds, gates and measures it. Each framework supplies a *lab* (its backend:
device, versions, sync, how to build a step from a recipe, measure, free memory, profile,
train) and a registry of declarations; this module runs them:

    config -> lab -> for each rung: recipe = change(base) -> fn(lab, recipe, base) -> RungResult
           -> LadderResult.finalize() (ratios, verdicts, regimes) -> kernel report -> learning check

How rungs chain. A seed rung builds on the rung it names (``builds_on``), and its recipe is
that rung's recipe with its own ``change`` applied, whether or not that rung ran in this
ladder. The beyond rungs start from the lab's ``seed_top`` and build on the fastest
configuration so far: a rung is kept (the next one builds on it) when its verdict is
'faster' -- judged against both measurements' noise, and never for a measurement that did
not settle. One exception keeps a disturbed base from discarding a real fix: a settled rung
whose slowest window beats every window of a base that did not settle is kept, though its
speedup is not credited. In the smoke configuration the numbers mean nothing, so they do not decide:
every added technique is kept and a choice between implementations (``alternative``) is
not, so a smoke run always walks the same configurations. Multi-GPU rungs run last.

A rung whose function raises (a gate refusing the model, a kernel refusing the shape, memory
running out) becomes a loud 'skipped' entry with the error, and the ladder goes on.
"""
from __future__ import annotations

import re
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from perfladder.kernels.taxonomy import ROOFLINE_GROUPS
from perfladder.measure.verdict import above_unsettled_base
from perfladder.results.record import STAGES, LadderResult, RungResult

KEY = re.compile(r"^[a-z0-9_]+$")
RUNG_KINDS = ("rung", "control", "multi-gpu")


class Recipe(Protocol):
    def replace(self, **changes) -> "Recipe": ...
    def to_dict(self) -> dict: ...


@dataclass(frozen=True)
class Rung:
    """One rung, declared once (see the module docstring)."""
    name: str
    key: str
    label: str
    fn: Callable[..., RungResult]              # fn(lab, recipe, base_name) -> RungResult
    stage: str = "seed"                        # "seed" | "beyond" | "multi-gpu"
    kind: str = "rung"                         # "rung" | "control" | "multi-gpu"
    builds_on: str | None = None               # seed rungs: the rung it changes
    change: Callable[[Any, Any], Any] | None = None   # change(recipe, config) -> recipe
    gate: str = ""                             # what proves the same model
    section: str = ""                          # the chapter section whose tool it applies
    attacks: str = ""                          # kernel category / cost it goes after
    targets: tuple[str, ...] = ()              # the roofline groups it attacks (kernels.taxonomy.ROOFLINE_GROUPS)
    alternative: bool = False                  # a choice between implementations
    optional: bool = False                     # run only when named
    needs_gpu: str | None = None               # why the technique does not exist on CPU

    def __post_init__(self):
        if not KEY.match(self.key):
            raise ValueError(f"rung {self.name!r}: key={self.key!r} must match {KEY.pattern}")
        if self.stage not in STAGES:
            raise ValueError(f"rung {self.name!r}: stage={self.stage!r}; valid choices: {STAGES}")
        if self.kind not in RUNG_KINDS:
            raise ValueError(f"rung {self.name!r}: kind={self.kind!r}; valid choices: {RUNG_KINDS}")
        bad = [t for t in self.targets if t not in ROOFLINE_GROUPS]
        if isinstance(self.targets, str) or bad:
            raise ValueError(f"rung {self.name!r}: targets={self.targets!r} must be a tuple of roofline "
                             f"groups; valid choices: {', '.join(ROOFLINE_GROUPS)}")

    def __call__(self, lab, recipe, base: str | None) -> RungResult:
        return self.fn(lab, recipe, base)


def registry(rungs: Iterable[Rung]) -> dict[str, Rung]:
    """Ordered ``{name: Rung}``; names and keys unique, stages in order, ``builds_on`` earlier."""
    out: dict[str, Rung] = {}
    keys: set[str] = set()
    order = {s: i for i, s in enumerate(STAGES)}
    last = 0
    for r in rungs:
        if r.name in out:
            raise ValueError(f"rung name {r.name!r} declared twice")
        if r.key in keys:
            raise ValueError(f"technique key {r.key!r} declared twice (rung {r.name!r})")
        if order[r.stage] < last:
            raise ValueError(f"rung {r.name!r} ({r.stage}) is declared after a later stage")
        if r.builds_on is not None and r.builds_on not in out:
            raise ValueError(f"rung {r.name!r} builds on {r.builds_on!r}, which is not declared before it")
        last = order[r.stage]
        out[r.name] = r
        keys.add(r.key)
    return out


def check_rungs(rungs: dict[str, Rung], names=None, optional: bool = False) -> list[str]:
    """Rung names in ladder order. ``None``: every rung but the optional ones (those too with
    ``optional``). An unknown name is an error listing the valid ones."""
    if names is None:
        return [n for n, r in rungs.items() if optional or not r.optional]
    if isinstance(names, str):
        names = [names]
    names = list(names)
    unknown = [n for n in names if n not in rungs]
    if unknown:
        raise ValueError(f"unknown rung(s) {', '.join(map(repr, unknown))}; "
                         f"valid choices: {', '.join(rungs)}")
    return [n for n in rungs if n in set(names)]


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

    def base(self, rung: Rung) -> tuple[str | None, Any]:
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
            self.fastest = (self.lab.seed_top, self.recipe_of(self.lab.seed_top))
        return self.fastest


def failed(rung: Rung, lab, base: str | None, recipe, error: str, tb: str = "") -> RungResult:
    """The 'skipped' entry of a rung that measured nothing, said loudly on stderr."""
    print(f"perfladder: {lab.framework} {rung.name} ({rung.label}) not measured: {error}",
          file=sys.stderr, flush=True)
    return RungResult(name=rung.name, key=rung.key, label=rung.label, kind="skipped",
                      stage=rung.stage, builds_on=base,
                      recipe=recipe.to_dict() if recipe is not None else {},
                      precision=getattr(recipe, "precision", None) or "fp32",
                      error=error[:3000], section=rung.section,
                      details={"traceback": tb[-4000:]} if tb else {})


def run_rung(rung: Rung, lab, chain: Chain) -> RungResult:
    """Build the rung's recipe on its base, run it (failures become skipped rungs), record it."""
    base, base_recipe = chain.base(rung)
    recipe = base_recipe
    try:
        if rung.change is not None:
            recipe = rung.change(base_recipe, lab.config)
        if rung.needs_gpu and not lab.on_gpu:
            res = failed(rung, lab, base, recipe, f"not applicable on CPU: {rung.needs_gpu}")
        else:
            res = rung(lab, recipe, base)
    except Exception as e:     # the ladder goes on; the entry says what happened
        res = failed(rung, lab, base, recipe, f"{type(e).__name__}: {e}", traceback.format_exc())
    finally:
        lab.free()
    res.name, res.key, res.stage, res.section = rung.name, rung.key, rung.stage, rung.section
    res.label = res.label or rung.label
    if res.kind != "skipped":
        res.kind = rung.kind            # the declaration decides what a measurement is
    if res.builds_on is None:
        res.builds_on = base
    lab.result.add(res)
    if res.measured:
        chain.recipes[rung.name] = lab.recipe_from_dict(res.recipe) if res.recipe else recipe
    if rung.stage == "beyond":
        chain.top()
        res.kept = keeps(rung, res, lab.config.is_smoke)
        if res.kept:
            chain.fastest = (rung.name, chain.recipes[rung.name])
    return res


class LadderRun:
    """One ladder on one lab, run rung by rung (a notebook cell per rung) or all at once
    (``run_ladder``). ``result`` is the growing ``LadderResult``."""

    def __init__(self, lab, rungs: dict[str, Rung], resume: LadderResult | None = None):
        self.lab, self.rungs, self.chain = lab, rungs, Chain(rungs, lab)
        if resume is not None:
            self._resume(resume)

    def _resume(self, earlier: LadderResult) -> None:
        """Continue ``earlier`` (a results file of the same framework and config): its rungs
        stay as measured, the chain picks up from its recipes and its last kept beyond rung."""
        lab = self.lab
        if earlier.framework != lab.framework or earlier.config.get("name") != lab.config.name:
            raise ValueError(f"cannot continue a {earlier.framework} {earlier.config.get('name')!r} "
                             f"run with a {lab.framework} {lab.config.name!r} ladder")
        earlier.notes.append(f"continued by: {lab.result.command or 'a later run'}")
        lab.result = earlier
        for r in earlier.rungs:
            if r.measured and r.recipe and r.name in self.rungs:
                self.chain.recipes[r.name] = lab.recipe_from_dict(r.recipe)
        kept = [r.name for r in earlier.rungs if r.kept and r.name in self.chain.recipes]
        if kept:
            self.chain.fastest = (kept[-1], self.chain.recipes[kept[-1]])

    @property
    def result(self) -> LadderResult:
        return self.lab.result

    def run(self, name: str) -> RungResult:
        """Run rung ``name`` (in any order the caller likes; its base is what ran so far)."""
        check_rungs(self.rungs, [name])
        if any(r.name == name for r in self.result.rungs):
            raise ValueError(f"rung {name!r} already ran in this ladder")
        return run_rung(self.rungs[name], self.lab, self.chain)

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
               resume: LadderResult | None = None) -> LadderResult:
    """Run ``names`` (default: every non-optional rung) of ``rungs`` on ``lab`` in ladder order,
    then the kernel report of the fastest configuration (when beyond rungs ran), then the
    learning check of that configuration. ``progress(event, name, payload)`` hears
    ``('start', name, None)`` and ``('end', name, RungResult | LearningCheck)``. ``resume``:
    an earlier result of the same ladder to continue (its rungs are not run again)."""
    order = check_rungs(rungs, names, optional=optional)
    run = LadderRun(lab, rungs, resume=resume)
    done = {r.name for r in run.result.rungs}
    order = [n for n in order if n not in done]

    def step(name, thunk):
        if progress:
            progress("start", name, None)
        out = thunk()
        if progress:
            progress("end", name, out)
        return out

    for name in order:
        step(name, lambda name=name: run.run(name))
    if kernels and any(rungs[n].stage == "beyond" for n in order):
        run.kernel_report()
    if learn:
        step("learning", run.learning_check)
    return run.result.finalize()


def fastest(lab, chain: Chain) -> tuple[str, Any]:
    """The configuration the kernel report and the learning check use: the chain's top once
    beyond rungs ran; else the fastest settled seed waterfall rung (smoke: ``seed_top``, since
    its numbers decide nothing); else ``seed_top``'s declared recipe."""
    if chain.fastest is not None:
        return chain.fastest
    ran = [r for r in lab.result.waterfall() if r.name in chain.recipes and r.stable is not False]
    if ran and not lab.config.is_smoke:
        best = max(ran, key=lambda r: r.tokens_per_s)
        return best.name, chain.recipes[best.name]
    return lab.seed_top, chain.recipe_of(lab.seed_top)


def kernel_report(lab, chain: Chain) -> dict | None:
    """The kernel breakdown of the fastest configuration, on its rung (``kernels``); a profiler
    failure costs the report, not the ladder (recorded in the rung's details and the notes)."""
    name, recipe = fastest(lab, chain)
    try:
        report = lab.kernel_report(name, recipe)
    except Exception as e:
        msg = f"{type(e).__name__}: {e}"[:2000]
        lab.result.notes.append(f"kernel breakdown of {name} failed: {msg}")
        print(f"perfladder: {lab.result.notes[-1]}", file=sys.stderr, flush=True)
        report = None
        try:
            lab.result.rung(name).details["kernels_error"] = msg
        except KeyError:
            pass
    finally:
        lab.free()
    if report is not None:
        try:
            lab.result.rung(name).kernels = report
        except KeyError:
            lab.result.notes.append(f"kernel breakdown of {name}'s configuration: {name} not in this run")
    return report


def learning_check(lab, chain: Chain):
    """Train the fastest configuration from a fresh init; the check is stored on the result."""
    name, recipe = fastest(lab, chain)
    try:
        check = lab.learning_check(name, recipe)
    finally:
        lab.free()
    check.configuration = name
    lab.result.learning = check
    return check

