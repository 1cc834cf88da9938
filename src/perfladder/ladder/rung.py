"""A rung, declared once (framework-free): ``Rung``, the registry, and what a rung is handed
and gives back.

A rung is a display ``name`` in one framework ("R1", "B4"), a technique ``key`` shared by both
frameworks (what the technique does, attacks and which chapter section teaches it live once,
under that key, in ``perfladder.ladder.techniques``), a bar ``label``, the ``change`` it makes to
the recipe it builds on, what proves it computes the same model (``gate``), and the function
that measures it. The engine hands that function a ``Given`` (its declaration, its recipe, its
base's name, result and recipe) and gets ``Evidence`` back; the engine alone turns evidence into
the rung's ``RungResult``. A rung that decides not to measure (the technique is already what
runs) raises ``NotMeasured`` with what it found.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from perfladder.kernels.taxonomy import ROOFLINE_GROUPS
from perfladder.ladder.techniques import TECHNIQUES, Technique, technique
from perfladder.measure.evidence import (
    Compile,
    Gate,
    Memory,
    Prediction,
    ProfileSummary,
    Receipt,
    Timing,
)
from perfladder.measure.timing import Stopwatch

KEY = re.compile(r"^[a-z0-9_]+$")
STAGES = ("seed", "beyond", "multi-gpu")
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
    fn: Callable[..., "Evidence"]              # fn(lab, given) -> Evidence
    stage: str = "seed"                        # see STAGES
    kind: str = "rung"                         # see RUNG_KINDS
    builds_on: str | None = None               # seed rungs: the rung it changes
    change: Callable[[Any, Any], Any] | None = None   # change(recipe, config) -> recipe
    gate: str = ""                             # what proves the same model
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
        if self.key not in TECHNIQUES:
            raise ValueError(f"rung {self.name!r}: technique key {self.key!r} is not described in "
                             "perfladder.ladder.techniques (what it does, its section, what it "
                             f"targets); valid choices: {', '.join(TECHNIQUES)}")
        bad = [t for t in self.technique.targets if t not in ROOFLINE_GROUPS]
        if bad:
            raise ValueError(f"technique {self.key!r}: targets {bad} are not roofline groups; valid "
                             f"choices: {', '.join(ROOFLINE_GROUPS)}")

    @property
    def technique(self) -> Technique:
        return technique(self.key)

    @property
    def section(self) -> str:
        return self.technique.section

    @property
    def attacks(self) -> str:
        return self.technique.cost

    @property
    def targets(self) -> tuple[str, ...]:
        return self.technique.targets


@dataclass
class Given:
    """What the engine hands a rung: its declaration, the recipe to run (its base's with the
    rung's ``change`` applied), and the configuration it builds on."""
    rung: Rung
    recipe: Any
    base_name: str | None = None
    base: Any = None                           # the base's RungResult, when it ran
    base_recipe: Any = None
    # the rung's wall seconds per phase, kept by the engine: what a rung that fails spent too
    watch: Stopwatch = field(default_factory=Stopwatch)


@dataclass
class Evidence:
    """What a rung measured; the engine builds its ``RungResult`` from this and the declaration."""
    timing: Timing
    recipe: Any = None                         # what ran, when not the recipe it was given
    gates: list[Gate] = field(default_factory=list)
    receipt: Receipt | None = None
    compile: Compile | None = None
    memory: Memory | None = None
    profile: ProfileSummary | None = None
    prediction: Prediction | None = None
    details: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    devices: int = 1                           # over how many devices the rate was measured


class NotMeasured(Exception):
    """A rung that found nothing to measure (not a failure): the reason, and what it found.
    Subclasses name a property of the card instead (``outcome``, one of
    ``perfladder.results.record.OUTCOMES``)."""

    outcome = "not_measured"

    def __init__(self, reason: str, *, recipe=None, details: dict | None = None,
                 prediction: Prediction | None = None):
        super().__init__(reason)
        self.reason, self.recipe, self.details, self.prediction = reason, recipe, details or {}, prediction


class DoesNotFit(NotMeasured):
    """The rung needs more device memory than there is (its details: the memory it needs and
    the memory there is, ``perfladder.ladder.fit``)."""

    outcome = "does_not_fit"


class NotSupported(NotMeasured):
    """The card cannot compute the rung's precision (bf16 without bf16 tensor cores): no
    emulated number is credited to it."""

    outcome = "not_supported"


class NotApplicable(NotMeasured):
    """The rung's kernels cannot run on this card (its compute capability, a missing compiler)."""

    outcome = "not_applicable"


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


def later(rungs: dict[str, Rung], name: str, *, targets: str | None = None) -> list[Rung]:
    """The rungs declared after ``name`` (that target roofline group ``targets``, if given): what a
    sentence about "a later rung" must read, so it names only rungs that exist."""
    names = list(rungs)
    after = [rungs[n] for n in names[names.index(name) + 1:]] if name in rungs else []
    return [r for r in after if targets is None or targets in r.targets]
