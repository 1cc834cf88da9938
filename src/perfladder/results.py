"""Result objects and the results-JSON schema, shared by both ladders (no framework imports).

Schema (``schema_version`` 1), one JSON object per ladder run::

    {
      "schema_version": 1,
      "framework": "torch" | "jax",
      "device": "NVIDIA H200" | "cpu" | ...,
      "config": {...LadderConfig fields...},
      "baseline": "R0",                 # the rung every ratio_base is taken against
      "versions": {"python": ..., "torch": ..., ...},
      "created": "2026-11-29T10:00:00Z",
      "command": "perfladder run torch --config full ...",
      "peak_tflops": {"bf16": 989.5, "tf32": 494.7, "measured_bf16": 790.0} | null,
      "rungs": [RungResult, ...],       # in ladder order
      "learning": LearningCheck | null,
      "notes": [str, ...]
    }

Each ``RungResult``::

    name          "R1"            short id, unique in the ladder
    label         "compile"       what the rung adds (bar label)
    kind          "rung" | "control" | "multi-gpu" | "skipped"
                  (only "rung" entries form the cumulative waterfall)
    tokens_per_s  median tokens/s over the timed windows (null if skipped)
    windows       tokens/s of every window
    spread        (max - min) / median of the windows
    batch_size, seq_len, precision ("fp32" | "tf32" | "bf16")
    ratio_prev    tokens_per_s / the previous waterfall rung's
    ratio_base    tokens_per_s / the baseline rung's
    tflops        achieved model TFLOP/s (flops_per_token * tokens/s)
    mfu           fraction of the device's datasheet peak, null when unknown
    peak_mem_bytes  measured peak device memory (torch) or compiler-planned
                  temporaries (jax: see notes), null when not applicable
    notes         list of strings (what was checked, what is not applicable and why)
    extra         free-form dict (compile seconds, profile tables, receipts, ...)
"""
from __future__ import annotations

import datetime as _dt
import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
FRAMEWORKS = ("torch", "jax")
KINDS = ("rung", "control", "multi-gpu", "skipped")
PRECISIONS = ("fp32", "tf32", "bf16", "fp8")


class ResultsError(ValueError):
    """A results file does not follow the schema."""


@dataclass
class RungResult:
    name: str
    label: str
    tokens_per_s: float | None
    windows: list[float] = field(default_factory=list)
    spread: float | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    precision: str = "tf32"
    kind: str = "rung"
    ratio_prev: float | None = None
    ratio_base: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    peak_mem_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return _jsonable(asdict(self))

    def __str__(self) -> str:
        if self.tokens_per_s is None:
            return f"{self.name} {self.label}: skipped ({'; '.join(self.notes)})"
        parts = [f"{self.name} {self.label}: {self.tokens_per_s:,.0f} tokens/s"]
        if self.spread is not None:
            parts.append(f"spread {100 * self.spread:.1f}%")
        if self.ratio_prev is not None:
            parts.append(f"{self.ratio_prev:.2f}x prev")
        if self.ratio_base is not None:
            parts.append(f"{self.ratio_base:.2f}x base")
        if self.tflops is not None:
            parts.append(f"{self.tflops:.1f} TFLOP/s")
        if self.mfu is not None:
            parts.append(f"MFU {100 * self.mfu:.1f}%")
        if self.peak_mem_bytes is not None:
            parts.append(f"mem {self.peak_mem_bytes / 2**30:.2f} GiB")
        return ", ".join(parts)


@dataclass
class LearningCheck:
    steps: int
    first: float          # mean loss of the first `window` steps
    last: float           # mean loss of the last `window` steps
    window: int
    losses: list[float] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.last < self.first

    def to_dict(self) -> dict:
        d = _jsonable(asdict(self))
        d["passed"] = self.passed
        return d

    def __str__(self) -> str:
        return (f"smoothed loss over {self.steps} steps: first {self.window} {self.first:.3f} -> "
                f"last {self.window} {self.last:.3f} ({'falls' if self.passed else 'DOES NOT FALL'})")


def smoothed_check(losses, window: int = 20) -> LearningCheck:
    """First-``window`` mean vs last-``window`` mean of a loss curve; raises if it did not fall."""
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"window={window!r} must be a positive integer")
    losses = [float(x) for x in losses]
    if len(losses) < 2 * window:
        raise ValueError(f"need at least {2 * window} losses for window={window}, got {len(losses)}")
    first = sum(losses[:window]) / window
    last = sum(losses[-window:]) / window
    check = LearningCheck(steps=len(losses), first=first, last=last, window=window, losses=losses)
    if not check.passed:
        raise AssertionError(f"speed that breaks the model is not speed: {check}")
    return check


LEARN_NOTE_PREFIX = "learning check: "


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
    peak_tflops: dict | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.framework not in FRAMEWORKS:
            raise ResultsError(f"framework={self.framework!r} is not valid; valid choices: {FRAMEWORKS}")

    # -- access ----------------------------------------------------------------------
    def rung(self, name: str) -> RungResult:
        for r in self.rungs:
            if r.name == name:
                return r
        raise KeyError(f"no rung {name!r}; rungs here: {[r.name for r in self.rungs]}")

    def waterfall(self) -> list[RungResult]:
        """The rungs that form the cumulative waterfall, in order."""
        return [r for r in self.rungs if r.kind == "rung" and r.tokens_per_s is not None]

    def best(self) -> RungResult:
        return max(self.waterfall(), key=lambda r: r.tokens_per_s)

    def set_learning(self, check: "LearningCheck", note: str) -> "LearningCheck":
        """Record the learning check and its note (``"learning check: ..."``), replacing the
        note of an earlier check, so a re-run leaves exactly one."""
        if not note.startswith(LEARN_NOTE_PREFIX):
            raise ValueError(f"a learning-check note starts with {LEARN_NOTE_PREFIX!r}; got {note!r}")
        self.learning = check
        self.notes[:] = [n for n in self.notes if not n.startswith(LEARN_NOTE_PREFIX)] + [note]
        return check

    def add(self, rung: RungResult, prev: str | None = None) -> RungResult:
        """Append ``rung``, filling its ratios from the waterfall so far.

        ``prev`` names the rung it builds on; by default the last waterfall rung.
        Controls and multi-GPU entries get ratios against the baseline only.
        """
        if any(r.name == rung.name for r in self.rungs):
            raise ValueError(f"rung {rung.name!r} is already in this ladder")
        if rung.tokens_per_s is not None:
            base = next((r for r in self.rungs if r.name == self.baseline), None)
            if base is None and rung.name == self.baseline:
                base = rung
            if base is not None and base.tokens_per_s:
                rung.ratio_base = rung.tokens_per_s / base.tokens_per_s
            if rung.kind == "rung":
                chain = self.waterfall()
                before = self.rung(prev) if prev else (chain[-1] if chain else None)
                if before is not None and before.tokens_per_s:
                    rung.ratio_prev = rung.tokens_per_s / before.tokens_per_s
        self.rungs.append(rung)
        return rung

    # -- (de)serialisation ------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "framework": self.framework,
            "device": self.device,
            "config": _jsonable(self.config),
            "baseline": self.baseline,
            "versions": dict(self.versions),
            "created": self.created,
            "command": self.command,
            "peak_tflops": self.peak_tflops,
            "rungs": [r.to_dict() for r in self.rungs],
            "learning": None if self.learning is None else self.learning.to_dict(),
            "notes": list(self.notes),
        }

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_dict()
        validate(data, source=str(path))
        path.write_text(json.dumps(data, indent=1) + "\n")
        return path

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> "LadderResult":
        validate(data, source)
        rung_fields = set(RungResult.__dataclass_fields__)
        rungs = [RungResult(**{k: v for k, v in r.items() if k in rung_fields}) for r in data["rungs"]]
        learning = None
        if data.get("learning"):
            lf = set(LearningCheck.__dataclass_fields__)
            learning = LearningCheck(**{k: v for k, v in data["learning"].items() if k in lf})
        return cls(framework=data["framework"], device=data["device"], config=data["config"],
                   baseline=data["baseline"], rungs=rungs, versions=data.get("versions", {}),
                   learning=learning, created=data.get("created", ""),
                   command=data.get("command", ""), peak_tflops=data.get("peak_tflops"),
                   notes=data.get("notes", []))

    @classmethod
    def read(cls, path: str | Path) -> "LadderResult":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as e:
            raise ResultsError(f"{path}: no such results file") from e
        except OSError as e:
            raise ResultsError(f"{path}: cannot read results file ({e.strerror or e})") from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ResultsError(f"{path}: not valid JSON ({e})") from e
        return cls.from_dict(data, source=str(path))

    def table(self) -> str:
        """A plain-text table of every rung."""
        head = f"{'rung':<5} {'what':<22} {'tokens/s':>12} {'spread':>7} {'x prev':>7} {'x base':>7} {'TFLOP/s':>8} {'MFU':>6} {'mem GiB':>8}"
        lines = [f"{self.framework} on {self.device} ({self.config.get('name', '?')} config), "
                 f"ratios to {self.baseline}", head, "-" * len(head)]
        f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        for r in self.rungs:
            lines.append(f"{r.name:<5} {r.label[:22]:<22} {f(r.tokens_per_s, ',.0f'):>12} "
                         f"{f(None if r.spread is None else 100 * r.spread, '.1f'):>6}% "
                         f"{f(r.ratio_prev, '.2f'):>7} {f(r.ratio_base, '.2f'):>7} "
                         f"{f(r.tflops, '.1f'):>8} {f(None if r.mfu is None else 100 * r.mfu, '.1f'):>6} "
                         f"{f(None if r.peak_mem_bytes is None else r.peak_mem_bytes / 2**30, '.2f'):>8}")
        if self.learning is not None:
            lines.append(str(self.learning))
        return "\n".join(lines)


# -- validation ----------------------------------------------------------------------------
_TOP = {"schema_version": int, "framework": str, "device": str, "config": dict,
        "baseline": str, "rungs": list}
_RUNG = {"name": str, "label": str, "kind": str, "windows": list, "notes": list}
_NUM = (int, float)


def validate(data: Any, source: str = "<results>") -> None:
    """Raise ``ResultsError`` naming the first thing wrong with a results dict."""
    def bad(msg):
        raise ResultsError(f"{source}: {msg}")
    if not isinstance(data, dict):
        bad(f"top level must be a JSON object, got {type(data).__name__}")
    for key, typ in _TOP.items():
        if key not in data:
            bad(f"missing required key {key!r}")
        if not isinstance(data[key], typ):
            bad(f"{key!r} must be {typ.__name__}, got {type(data[key]).__name__}")
    if data["schema_version"] != SCHEMA_VERSION:
        bad(f"schema_version {data['schema_version']} is not supported (expected {SCHEMA_VERSION})")
    if data["framework"] not in FRAMEWORKS:
        bad(f"framework {data['framework']!r} is not one of {FRAMEWORKS}")
    names = []
    for i, r in enumerate(data["rungs"]):
        where = f"rungs[{i}]"
        if not isinstance(r, dict):
            bad(f"{where} must be an object")
        for key, typ in _RUNG.items():
            if key not in r:
                bad(f"{where} is missing {key!r}")
            if not isinstance(r[key], typ):
                bad(f"{where}.{key} must be {typ.__name__}")
        if r["kind"] not in KINDS:
            bad(f"{where}.kind {r['kind']!r} is not one of {KINDS}")
        if r.get("precision", "tf32") not in PRECISIONS:
            bad(f"{where}.precision {r.get('precision')!r} is not one of {PRECISIONS}")
        t = r.get("tokens_per_s")
        if r["kind"] == "skipped":
            if t is not None:
                bad(f"{where} is 'skipped' but has tokens_per_s")
        elif not isinstance(t, _NUM) or isinstance(t, bool) or not t > 0:   # NaN fails too
            bad(f"{where}.tokens_per_s must be a positive number, got {t!r}")
        if not all(isinstance(w, _NUM) and w > 0 for w in r["windows"]):
            bad(f"{where}.windows must hold positive numbers")
        for key in ("ratio_prev", "ratio_base", "tflops", "mfu", "spread"):
            v = r.get(key)
            if v is not None and (not isinstance(v, _NUM) or isinstance(v, bool)):
                bad(f"{where}.{key} must be a number or null, got {v!r}")
        for key in ("batch_size", "seq_len", "peak_mem_bytes"):
            v = r.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                bad(f"{where}.{key} must be an integer or null, got {v!r}")
        if not all(isinstance(n, str) for n in r["notes"]):
            bad(f"{where}.notes must be a list of strings")
        if not isinstance(r.get("extra", {}), dict):
            bad(f"{where}.extra must be an object")
        names.append(r["name"])
    if len(set(names)) != len(names):
        bad(f"rung names repeat: {names}")
    # The baseline may be absent from a partial run (``--rungs R1``), but then nothing can
    # have been measured against it.
    if data["baseline"] not in names:
        with_ratio = [r["name"] for r in data["rungs"] if r.get("ratio_base") is not None]
        if with_ratio:
            bad(f"baseline {data['baseline']!r} is not among the rungs {names}, yet "
                f"{with_ratio} carry ratio_base values against it")
    for key, typ in (("versions", dict), ("notes", list), ("command", str), ("created", str)):
        if key in data and not isinstance(data[key], typ):
            bad(f"{key!r} must be {typ.__name__}, got {type(data[key]).__name__}")
    if data.get("peak_tflops") is not None and not isinstance(data["peak_tflops"], dict):
        bad(f"'peak_tflops' must be an object or null, got {type(data['peak_tflops']).__name__}")
    learning = data.get("learning")
    if learning is not None:
        if not isinstance(learning, dict):
            bad(f"'learning' must be an object or null, got {type(learning).__name__}")
        for key, typ in (("steps", int), ("window", int), ("first", _NUM), ("last", _NUM)):
            if key not in learning:
                bad(f"learning is missing {key!r}")
            if not isinstance(learning[key], typ) or isinstance(learning[key], bool):
                bad(f"learning.{key} must be a number, got {learning[key]!r}")


def python_versions(**modules) -> dict[str, str]:
    """Versions of python and of the given imported modules (name=module)."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for name, mod in modules.items():
        out[name] = getattr(mod, "__version__", "?")
    return out


def _jsonable(x):
    """Plain JSON types (numpy / jax / torch scalars become floats, tuples lists)."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return x
    if hasattr(x, "item"):
        try:
            return x.item()
        except (TypeError, ValueError):
            pass
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)
