"""Will a rung fit in the device's memory? Predicted before it runs, from what the ladder has
already measured (framework-free).

A training step's device memory has two parts. What does not grow with the batch: the
parameters, their gradients and AdamW's two moments (the lab's ``fixed_bytes``). And the
activations, which grow in proportion to the batch. A measured rung's memory record
(``perfladder.measure.evidence.Memory``: PyTorch's measured peak, JAX's planned temporaries plus
the state the lab says the step holds beside them, ``held_bytes``) gives its configuration's
activations per sequence, ``(bytes - fixed) / batch``; a rung about to run is predicted from
the measured configuration most like its own:

* only one that computes in the same precision and checkpoints as it does (``must_match``:
  bf16 halves the activations, checkpointing drops most of them, so neither is extrapolated
  across);
* of those, the rung it builds on (its ``base``), when that was measured: the configuration it
  changes, so the prediction carries everything the ladder kept;
* else the one whose recipe differs from it in the fewest other fields (the batch alone,
  best), the latest on a tie.

With nothing like it measured there is no prediction and the rung runs. The memory there is
(``available``) is the device's free memory as the lab reads it, or the cap, whichever is
less: ``PERFLADDER_MEMORY_CAP_GIB`` (``memory_cap_gib``: the one place it is read), which the
labs also hand to the framework's allocator. A rung predicted to need more than there is,
with ``HEADROOM`` to spare, raises ``DoesNotFit``: one line (what it needs, what there is,
what it was predicted from, what checkpointing would need) and the numbers in its details.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Iterable

from perfladder.ladder.rung import DoesNotFit

MEMORY_CAP_VARIABLE = "PERFLADDER_MEMORY_CAP_GIB"
GIB = 2 ** 30
# the prediction is linear in the batch and the allocator fragments: a rung predicted within
# 5% of the room is not started (on the H200 runs the prediction from the next smaller batch
# was within 2% of the measured peak)
HEADROOM = 0.05
CHECKPOINT_KEY = "checkpoint"     # the recipe field of activation checkpointing (R4), both sides


def memory_cap_gib(environ=None) -> float | None:
    """The memory cap in GiB from ``$PERFLADDER_MEMORY_CAP_GIB``; ``None`` when unset. A value
    that is not a number > 0 is an error naming it."""
    env = os.environ if environ is None else environ
    text = str(env.get(MEMORY_CAP_VARIABLE, "")).strip()
    if not text:
        return None
    return check_cap_gib(text, f"${MEMORY_CAP_VARIABLE}")


def check_cap_gib(value, name: str = "memory_cap_gib") -> float:
    """A memory cap: a finite number of GiB > 0, else ``ValueError`` naming ``name``."""
    try:
        cap = float(value)
    except (TypeError, ValueError):
        cap = math.nan
    if isinstance(value, bool) or not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"{name}={value!r} is not valid; valid: a number of GiB > 0 (e.g. 24), "
                         "or unset for no cap")
    return cap


def gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


@dataclass(frozen=True)
class Point:
    """A measured configuration's device memory."""
    name: str
    batch: int
    bytes: int
    recipe: dict


def measured_points(rungs: Iterable, held_bytes: int = 0) -> list[Point]:
    """The measured rungs of a ladder (``RungResult``s) that recorded their memory, as points;
    ``held_bytes`` is added to each record (what the step holds beside it)."""
    out = []
    for r in rungs:
        mem = getattr(r, "memory", None)
        if (not r.measured or mem is None or mem.bytes is None or not r.batch_size
                or not r.recipe):
            continue
        out.append(Point(r.name, int(r.batch_size), int(mem.bytes) + int(held_bytes), dict(r.recipe)))
    return out


def differing(a: dict, b: dict) -> list[str]:
    """The recipe fields, other than the batch, in which ``a`` and ``b`` differ."""
    return sorted(k for k in set(a) | set(b) if k != "batch_size" and a.get(k) != b.get(k))


@dataclass(frozen=True)
class Estimate:
    """A configuration's predicted device memory at ``batch``, from ``basis``."""
    bytes: int
    batch: int
    basis: Point
    fixed_bytes: int
    per_sequence_bytes: float

    def to_dict(self) -> dict:
        return {"bytes": self.bytes, "batch": self.batch, "basis": self.basis.name,
                "basis_bytes": self.basis.bytes, "basis_batch": self.basis.batch,
                "fixed_bytes": self.fixed_bytes, "per_sequence_bytes": round(self.per_sequence_bytes)}

    def note(self) -> str:
        """What a measured rung's memory record says of its prediction."""
        return f"predicted before it ran: about {gib(self.bytes)}, from {self.basis.name} at batch {self.basis.batch}"

    def source(self) -> str:
        return (f"{self.basis.name}'s {gib(self.basis.bytes)} at batch {self.basis.batch}: "
                f"{gib(self.fixed_bytes)} that does not grow with the batch and "
                f"{self.per_sequence_bytes / 2**20:.1f} MiB per sequence")


def basis_for(recipe: dict, points: list[Point], must_match: tuple[str, ...],
              base: str | None = None) -> Point | None:
    """The measured point to predict ``recipe`` from (see the module docstring), or ``None``."""
    alike = [(i, p) for i, p in enumerate(points)
             if all(p.recipe.get(k) == recipe.get(k) for k in must_match)]
    if not alike:
        return None
    for _, p in alike:
        if p.name == base:
            return p
    return min(alike, key=lambda ip: (len(differing(ip[1].recipe, recipe)), -ip[0]))[1]


def estimate(recipe: dict, points: list[Point], fixed_bytes: int,
             must_match: tuple[str, ...], base: str | None = None) -> Estimate | None:
    """``recipe``'s device memory at its own batch, or ``None`` with nothing like it measured."""
    basis = basis_for(recipe, points, must_match, base)
    batch = recipe.get("batch_size")
    if basis is None or not batch:
        return None
    per_seq = max(0.0, (basis.bytes - fixed_bytes) / basis.batch)
    return Estimate(bytes=int(fixed_bytes + per_seq * batch), batch=int(batch), basis=basis,
                    fixed_bytes=int(fixed_bytes), per_sequence_bytes=per_seq)


def fits(needed: int, available: int | None) -> bool:
    return available is None or needed * (1 + HEADROOM) <= available


@dataclass(frozen=True)
class Fit:
    """What was predicted for one rung against the memory there is."""
    rung: str
    needed: Estimate | None
    available_bytes: int | None
    checkpointed: Estimate | None = None      # the same rung with activation checkpointing
    builds_on: str | None = None              # what later rungs build on, when it is refused
    cap_bytes: int | None = None

    @property
    def fits(self) -> bool:
        return self.needed is None or fits(self.needed.bytes, self.available_bytes)

    @property
    def checkpointing_fits(self) -> bool | None:
        """Would checkpointing let it fit? ``None``: no checkpointed configuration measured."""
        if self.checkpointed is None:
            return None
        return fits(self.checkpointed.bytes, self.available_bytes)

    def reason(self) -> str:
        """One line: the first clause what it needs and what there is (a page's short reason)."""
        n = self.needed
        cap = f" (capped at {gib(self.cap_bytes)})" if self.cap_bytes is not None else ""
        line = (f"does not fit: needs about {gib(n.bytes)} at batch {n.batch}, there is "
                f"{gib(self.available_bytes)}{cap}"
                + (f", so later rungs build on {self.builds_on}" if self.builds_on else "")
                + f"; predicted from {n.source()}")
        ck = self.checkpointed
        if ck is not None:
            verdict = "which fits" if self.checkpointing_fits else "which does not fit either"
            line += (f"; with activation checkpointing (as {ck.basis.name}) about {gib(ck.bytes)}, "
                     f"{verdict}")
        return line

    def details(self) -> dict:
        return {"memory_needed_bytes": None if self.needed is None else self.needed.bytes,
                "memory_available_bytes": self.available_bytes,
                "memory_cap_bytes": self.cap_bytes,
                "fit": {"needed": None if self.needed is None else self.needed.to_dict(),
                        "checkpointed": None if self.checkpointed is None else self.checkpointed.to_dict(),
                        "checkpointing_fits": self.checkpointing_fits,
                        "headroom": HEADROOM}}


def predict(name: str, recipe: dict, rungs: Iterable, *, fixed_bytes: int, held_bytes: int = 0,
            available_bytes: int | None, must_match: tuple[str, ...] = (CHECKPOINT_KEY,),
            base: str | None = None, builds_on: str | None = None,
            cap_bytes: int | None = None) -> Fit:
    """The fit of rung ``name`` (running ``recipe``, a recipe's ``to_dict()``, on the rung
    ``base``) given the ladder's results so far (``rungs``), without raising. ``builds_on``:
    what later rungs build on if this one is refused (a beyond rung's base), for its line."""
    must = tuple(dict.fromkeys((*must_match, CHECKPOINT_KEY)))
    points = measured_points(rungs, held_bytes)
    needed = estimate(recipe, points, fixed_bytes, must, base)
    ck = None
    if needed is not None and recipe.get(CHECKPOINT_KEY) is False:
        ck = estimate({**recipe, CHECKPOINT_KEY: True}, points, fixed_bytes, must)
    return Fit(name, needed, available_bytes, ck, builds_on, cap_bytes)


def check_fit(name: str, recipe: dict, rungs: Iterable, **kw) -> Fit:
    """``predict``, and ``DoesNotFit`` (its line, its numbers in the details) when it does not."""
    fit = predict(name, recipe, rungs, **kw)
    if not fit.fits:
        raise DoesNotFit(fit.reason(), details=fit.details())
    return fit


def check_plan(planned_bytes: int | None, held_bytes: int, batch: int,
               available_bytes: int | None, cap_bytes: int | None = None,
               predicted: Estimate | None = None) -> None:
    """After compiling, before running (JAX): the compiled program's own plan, its temporaries
    with the state the step holds beside them, against the memory there is. A prediction from
    another rung cannot see what a rung's kernels change in the plan (hand-written kernels
    that keep more for the backward); the compiler's plan can, at no cost but the compile the
    rung pays anyway. ``DoesNotFit`` (one line, its numbers in the details) when it does not fit."""
    if planned_bytes is None or available_bytes is None:
        return
    needed = int(planned_bytes) + int(held_bytes)
    if fits(needed, available_bytes):
        return
    cap = f" (capped at {gib(cap_bytes)})" if cap_bytes is not None else ""
    line = (f"does not fit: its compiled program plans {gib(planned_bytes)} of temporaries at batch "
            f"{batch} beside {gib(held_bytes)} of parameters and optimizer state, there is "
            f"{gib(available_bytes)}{cap}")
    if predicted is not None:
        line += f"; predicted before compiling: about {gib(predicted.bytes)}, from {predicted.basis.name}"
    raise DoesNotFit(line, details={
        "memory_needed_bytes": needed, "memory_available_bytes": available_bytes,
        "memory_cap_bytes": cap_bytes,
        "fit": {"planned_temp_bytes": int(planned_bytes), "held_bytes": int(held_bytes),
                "needed": None if predicted is None else predicted.to_dict(), "headroom": HEADROOM,
                "source": "the compiled program's plan"}})


def admit(lab, rung, given, *, basis: Iterable, must_match: tuple[str, ...], room,
          held_bytes: int = 0):
    """The check both labs run before a rung (``lab.admit``): ``NotSupported`` or
    ``NotApplicable`` for what the card cannot run (``perfladder.ladder.support.check_card``),
    then ``DoesNotFit`` when the memory predicted from ``basis`` (the measured rungs the
    framework trusts) is over ``room(cap_bytes)``, the bytes there are. The prediction, or None
    for a multi-GPU rung (its ranks hold their share of the batch, each on its own GPU)."""
    from perfladder.ladder.support import check_card
    recipe = given.recipe
    check_card(lab.device_name, lab.capability, lab.precision(recipe), lab.kernels(recipe))
    if rung.stage == "multi-gpu":
        return None
    cap = None if lab.memory_cap_gib is None else int(lab.memory_cap_gib * GIB)
    return check_fit(rung.name, recipe.to_dict(), basis, fixed_bytes=lab.fixed_bytes, held_bytes=held_bytes,
                     available_bytes=room(cap), must_match=must_match, cap_bytes=cap, base=given.base_name,
                     builds_on=given.base_name if rung.stage == "beyond" else None).needed


def out_of_memory(error: BaseException) -> bool:
    """Is ``error`` a framework's out-of-memory error (what a rung the prediction let through,
    or one with nothing to predict from, raises on a card too small for it)? PyTorch's
    ``torch.OutOfMemoryError``; XLA's ``RESOURCE_EXHAUSTED`` (JAX raises it as an
    ``XlaRuntimeError`` / ``JaxRuntimeError``). Read by name: this module imports neither."""
    names = {c.__name__ for c in type(error).__mro__}
    if "OutOfMemoryError" in names:
        return True
    return bool(names & {"XlaRuntimeError", "JaxRuntimeError"}) and "RESOURCE_EXHAUSTED" in str(error)


def out_of_memory_failure(error: BaseException, batch_size: int | None = None) -> dict:
    """What the engine records for a rung that ran out of device memory after all (the prediction
    let it through, or there was nothing to predict from): a property of the card, not an error
    of its code, said in one line (the framework's message to its first sentence, no traceback:
    ``details.cause`` keeps the message whole); else nothing."""
    if not out_of_memory(error):
        return {}
    message = " ".join(str(error).split())
    first = message.split(". ")[0].rstrip(".")
    at = f" at batch {batch_size}" if batch_size else ""
    return {"error": f"does not fit: ran out of device memory{at} ({first}); no prediction refused it first",
            "outcome": "does_not_fit",
            "details": {"cause": "out of device memory", "message": message[:2000]}}
