"""Result objects of a ladder run (no framework imports).

A ``RungResult`` holds what one rung measured in named, typed slots (``perfladder.measure.evidence``):
``timing`` (every window), ``profile``, ``receipt``, ``gates``, ``memory``, ``compile``,
``prediction``; the kernel breakdown of the fastest configuration in ``kernels``; rung-specific
measurements under fixed keys in ``details``. Everything that compares one rung with another
(``ratio_prev``, ``ratio_base``, ``verdict``, ``regime``) is derived by
``LadderResult.finalize()`` from those facts, so no rung ever edits another's result.

The JSON layout is written down in ``perfladder/results/schema/results-v2.schema.json``;
``perfladder.results.schema`` validates it and still reads version-1 files.
"""
from __future__ import annotations

import datetime as _dt
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfladder.measure import verdict as _verdict
from perfladder.measure.evidence import (
    Compile,
    Gate,
    Memory,
    Prediction,
    ProfileSummary,
    Receipt,
    Timing,
    _plain,
)
from perfladder.measure.learning import LearningCheck
from perfladder.measure.timing import did_settle
from perfladder.results.schema import read_json, upgrade, validate
from perfladder.results.version import SCHEMA_VERSION, ResultsError

FRAMEWORKS = ("torch", "jax")
KINDS = ("rung", "control", "multi-gpu", "skipped")
STAGES = ("seed", "beyond", "multi-gpu")
# What became of a rung, one word each. A measured rung is "measured"; an entry with no number
# says why:
#   "failed"          the machine failed it (out of space, a corrupt compile cache, a killed
#                     compile worker, a missing compiler): not a result; retried on --resume
#   "error"           its own code raised (a gate refused the model, a kernel refused the shape)
#   "does_not_fit"    a property of the card: the rung needs more memory than the device has
#   "not_supported"   a property of the card: its precision or kernels are not supported there
#   "not_applicable"  not for this machine at all (a GPU-only rung on a CPU)
#   "not_measured"    the rung found nothing to measure (not a failure)
OUTCOMES = ("measured", "failed", "error", "does_not_fit", "not_supported", "not_applicable",
            "not_measured")
# entries that are facts about the run or the card; everything else is tried again by --resume
FINAL_OUTCOMES = ("measured", "does_not_fit", "not_supported", "not_applicable", "not_measured")


_SLOTS = {"timing": Timing, "memory": Memory, "compile": Compile, "receipt": Receipt,
          "profile": ProfileSummary, "prediction": Prediction}


@dataclass
class RungResult:
    name: str                               # display name in its framework ("R1", "B4")
    key: str                                # technique key, shared by both frameworks
    label: str                              # bar label
    tokens_per_s: float | None = None       # median of the settled windows; None when skipped
    kind: str = "rung"                      # see KINDS; only measured "rung"s form the waterfall
    stage: str = "seed"
    precision: str = "tf32"
    batch_size: int | None = None
    seq_len: int | None = None
    builds_on: str | None = None            # the rung whose configuration it changes
    recipe: dict = field(default_factory=dict)
    kept: bool | None = None                # beyond rungs: did the next rung build on it?
    timing: Timing | None = None
    tflops: float | None = None             # achieved model TFLOP/s
    mfu: float | None = None                # against the datasheet peak; None when unknown
    mfu_peak: dict | None = None            # that peak: {'precision', 'tflops'} (rung_mfu)
    memory: Memory | None = None
    compile: Compile | None = None
    gates: list[Gate] = field(default_factory=list)
    receipt: Receipt | None = None
    profile: ProfileSummary | None = None
    prediction: Prediction | None = None
    kernels: dict | None = None             # KernelBreakdown.to_dict() (fastest configuration)
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str | None = None                # why a skipped rung measured nothing
    outcome: str | None = None              # see OUTCOMES; None in files written before it
    section: str = ""                       # the chapter section whose tool the rung applies
    built_on_earlier: list[str] = field(default_factory=list)   # rungs run again after this one
                                            # ran, down its chain (perfladder.ladder.rerun)
    replaces: dict | None = None            # the entry this one replaced: tokens_per_s, outcome, error
    # derived by LadderResult.finalize()
    ratio_prev: float | None = None
    ratio_base: float | None = None
    verdict: dict | None = None
    regime: dict | None = None

    @property
    def measured(self) -> bool:
        return self.tokens_per_s is not None

    @property
    def result_kind(self) -> str:
        """``outcome``, or for a file written before it: measured, or 'error' (an old skipped
        entry does not say whether the machine or the rung failed)."""
        if self.outcome is not None:
            return self.outcome
        return "measured" if self.measured else "error"

    @property
    def final(self) -> bool:
        """A fact of the run or the card (kept by --resume), not a failure to try again."""
        return self.result_kind in FINAL_OUTCOMES

    @property
    def windows(self) -> list[float]:
        return [] if self.timing is None else list(self.timing.windows)

    @property
    def spread(self) -> float | None:
        return None if self.timing is None else self.timing.spread

    @property
    def stable(self) -> bool | None:
        return None if self.timing is None else self.timing.stable

    def gate(self, name: str) -> Gate:
        for g in self.gates:
            if g.name == name:
                return g
        raise KeyError(f"rung {self.name} has no gate {name!r}; gates: {[g.name for g in self.gates]}")

    def to_dict(self) -> dict:
        out = {}
        for k in self.__dataclass_fields__:
            v = getattr(self, k)
            if k == "gates":
                v = [g.to_dict() for g in v]
            elif k in _SLOTS and v is not None:
                v = v.to_dict()
            out[k] = _plain(v)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "RungResult":
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k, typ in _SLOTS.items():
            if kw.get(k) is not None:
                kw[k] = typ.from_dict(kw[k])
        kw["gates"] = [Gate.from_dict(g) for g in kw.get("gates") or []]
        return cls(**kw)

    def __str__(self) -> str:
        if not self.measured:
            return f"{self.name} {self.label}: skipped ({self.error or '; '.join(self.notes)})"
        parts = [f"{self.name} {self.label}: {self.tokens_per_s:,.0f} tokens/s"]
        if self.timing is not None:
            parts.append(f"spread {100 * self.spread:.1f}%"
                         + ("" if self.timing.stable else " (DID NOT SETTLE)"))
        if self.ratio_prev is not None:
            parts.append(f"{self.ratio_prev:.2f}x {self.builds_on}")
        if self.verdict:
            parts.append(self.verdict["verdict"])
        if self.tflops is not None:
            parts.append(f"{self.tflops:.3g} TFLOP/s")
        if self.mfu is not None:
            parts.append(f"MFU {100 * self.mfu:.1f}%")
        return ", ".join(parts)


@dataclass
class LadderResult:
    framework: str
    device: str
    config: dict
    baseline: str
    rungs: list[RungResult] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    learning: LearningCheck | None = None
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc)
                         .strftime("%Y-%m-%dT%H:%M:%SZ"))
    command: str = ""
    peak_tflops: dict | None = None     # the datasheet's dense peaks (the MFU denominators)
    roofs: dict | None = None           # this run's own device probe: measured ceilings
    notes: list[str] = field(default_factory=list)
    fastest: str | None = None          # the configuration the ladder kept last (its kernel
                                        # report and learning check are of this rung)
    ahead: dict | None = None           # what compiling ahead of the first rung did and took
    memory_cap_gib: float | None = None  # the device memory the run was capped to (GiB), if any
    schema_read: int = SCHEMA_VERSION   # the schema version the file was written with

    def __post_init__(self):
        if self.framework not in FRAMEWORKS:
            raise ResultsError(f"framework={self.framework!r} is not valid; valid choices: {FRAMEWORKS}")

    # -- access ----------------------------------------------------------------------------
    def rung(self, name: str) -> RungResult:
        for r in self.rungs:
            if r.name == name:
                return r
        raise KeyError(f"no rung {name!r}; rungs here: {[r.name for r in self.rungs]}")

    def by_key(self, key: str) -> RungResult | None:
        return next((r for r in self.rungs if r.key == key), None)

    def waterfall(self) -> list[RungResult]:
        """The measured rungs that form the cumulative waterfall, in order."""
        return [r for r in self.rungs if r.kind == "rung" and r.measured]

    def best(self) -> RungResult:
        """The fastest rung whose measurement settled (any, when none did)."""
        chain = self.waterfall()
        if not chain:
            raise ValueError(f"no measured waterfall rung in this {self.framework} ladder")
        settled = [r for r in chain if did_settle(r.timing) is not False]
        return max(settled or chain, key=lambda r: r.tokens_per_s)

    def fastest_rung(self) -> RungResult:
        """*The* fastest configuration, the one every page names: the rung the ladder recorded as
        its fastest (the last one it kept) when it measured it, else the last measured rung it
        kept, else the rung that carries the kernel report, else ``best()`` (a run whose
        recorded fastest failed, or was not among the rungs it ran, still names a measured one)."""
        named = [r for r in self.rungs if r.name == self.fastest and r.measured]
        if named:
            return named[0]
        kept = [r for r in self.rungs if r.stage == "beyond" and r.kept and r.measured]
        if kept:                                   # the configuration the ladder ended on
            return kept[-1]
        with_kernels = [r for r in self.rungs if r.kernels and r.measured]
        return with_kernels[-1] if with_kernels else self.best()

    def attach_kernels(self, name: str, report: dict | None, error: str = "") -> None:
        """The kernel breakdown of configuration ``name`` (or why there is none), kept with that
        rung's record."""
        try:
            r = self.rung(name)
        except KeyError:
            self.notes.append(f"kernel breakdown of {name}'s configuration: {name} not in this run")
            return
        r.kernels = report
        if error:
            r.details["kernels_error"] = error

    def add(self, rung: RungResult) -> RungResult:
        if any(r.name == rung.name for r in self.rungs):
            raise ValueError(f"rung {rung.name!r} is already in this ladder")
        self.rungs.append(rung)
        self.finalize()
        return rung

    def finalize(self) -> "LadderResult":
        """Derive every cross-rung number from the rungs' own facts (idempotent)."""
        measured = {r.name: r for r in self.rungs if r.measured}
        base = measured.get(self.baseline)
        roof = (self.roofs or {}).get("matmul_bf16_tflops")
        for r in self.rungs:
            r.ratio_prev = r.ratio_base = r.verdict = None
            if not r.measured:
                continue
            if base is not None and self.baseline not in r.built_on_earlier:
                r.ratio_base = r.tokens_per_s / base.tokens_per_s
            # never read across versions: a base run again after this rung ran is not its base
            before = measured.get(r.builds_on) if r.builds_on not in r.built_on_earlier else None
            if before is not None:
                r.ratio_prev = r.tokens_per_s / before.tokens_per_s
                r.verdict = _verdict.verdict(r, before)
            r.regime = _verdict.regime(r, roof_tflops=roof, copy_gbps=(self.roofs or {}).get("copy_gbps"))
        return self

    # -- (de)serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "framework": self.framework,
            "device": self.device,
            "config": _plain(self.config),
            "baseline": self.baseline,
            "versions": dict(self.versions),
            "created": self.created,
            "command": self.command,
            "peak_tflops": self.peak_tflops,
            "roofs": self.roofs,
            "rungs": [r.to_dict() for r in self.rungs],
            "learning": None if self.learning is None else self.learning.to_dict(),
            "notes": list(self.notes),
            "fastest": self.fastest,
            "ahead": self.ahead,
            "memory_cap_gib": self.memory_cap_gib,
        }

    def write(self, path: str | Path) -> Path:
        from perfladder.outputs import replace_atomically
        path = Path(path)
        data = self.finalize().to_dict()
        validate(data, source=str(path))
        try:           # a temporary of its own (concurrent writers never share one), always removed
            replace_atomically(path, (json.dumps(data, indent=1, allow_nan=False) + "\n").encode())
        except OSError as e:
            raise ResultsError(f"{path}: cannot write the results file ({e.strerror or e})") from None
        return path

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>", digest: bytes | None = None) -> "LadderResult":
        """``digest``: ``schema.read_json``'s, of the text ``data`` was read from."""
        version = data.get("schema_version") if isinstance(data, dict) else None
        data = upgrade(data, source)
        validate(data, source, digest)
        res = cls(framework=data["framework"], device=data["device"], config=data["config"],
                  baseline=data["baseline"],
                  rungs=[RungResult.from_dict(r) for r in data["rungs"]],
                  versions=data.get("versions", {}),
                  learning=LearningCheck.from_dict(data.get("learning")),
                  created=data.get("created", ""), command=data.get("command", ""),
                  peak_tflops=data.get("peak_tflops"), roofs=data.get("roofs"),
                  notes=data.get("notes", []), fastest=data.get("fastest"), ahead=data.get("ahead"),
                  memory_cap_gib=data.get("memory_cap_gib"), schema_read=version)
        return res.finalize()

    @classmethod
    def read(cls, path: str | Path) -> "LadderResult":
        path = Path(path)
        data, digest = read_json(path)
        return cls.from_dict(data, source=str(path), digest=digest)


def python_versions(**modules) -> dict[str, str]:
    """Versions of perfladder, python and the given imported modules (name=module)."""
    from perfladder import __version__
    out = {"perfladder": __version__, "python": platform.python_version(), "platform": platform.platform()}
    for name, mod in modules.items():
        out[name] = getattr(mod, "__version__", "?")
    return out

