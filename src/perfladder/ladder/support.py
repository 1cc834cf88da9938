"""Can this card compute a rung's precision and run its kernels? Checked before the rung runs
(framework-free).

A GPU below compute capability 8.0 (V100, T4) has no bf16 tensor cores: a bf16 rung there would
time an emulation under a bf16 label, so it is not run (``NotSupported``, outcome
'not_supported'). A rung whose kernels cannot compile for the card (Triton or Pallas kernels
below the capability they are written for, or their compiler not installed) is not run either
(``NotApplicable``, outcome 'not_applicable'). Each lab says what its recipe's kernels need
(``Kernels``); ``capability`` ``None`` (a CPU) checks nothing: there the frameworks run every
precision in software, and the smoke numbers mean nothing anyway.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfladder.hardware import BF16_CAPABILITY, supports_bf16
from perfladder.ladder.rung import NotApplicable, NotSupported


def capability_text(capability) -> str:
    return ".".join(str(x) for x in capability)


@dataclass(frozen=True)
class Kernels:
    """Kernels a recipe runs that need more than the framework's defaults."""
    what: str                          # "our Triton kernels (rope, gelu)"
    capability: tuple[int, int]        # the least compute capability they compile for
    compiler: str | None = None        # the package that compiles them ("triton")
    present: bool = True               # is that compiler installed in this Python


def check_precision(device: str, capability, precision: str) -> None:
    """``NotSupported`` for a bf16 rung on a GPU without bf16 tensor cores."""
    if precision == "bf16" and supports_bf16(capability) is False:
        raise NotSupported(
            f"not supported on {device} (compute capability {capability_text(capability)}): bf16 "
            f"needs bf16 tensor cores, compute capability {capability_text(BF16_CAPABILITY)} or "
            "newer; no emulated bf16 number is credited",
            details={"capability": capability_text(capability), "precision": precision})


def check_kernels(device: str, capability, kernels: list[Kernels]) -> None:
    """``NotApplicable`` for kernels the card cannot run (see the module docstring)."""
    if capability is None:
        return
    for k in kernels:
        why = None
        if not k.present:
            why = f"{k.what} need {k.compiler}, which is not installed in this Python"
        elif tuple(capability) < tuple(k.capability):
            why = (f"{k.what} compile for compute capability {capability_text(k.capability)} "
                   "or newer")
        if why is not None:
            raise NotApplicable(
                f"not applicable on {device} (compute capability {capability_text(capability)}): {why}",
                details={"capability": capability_text(capability), "kernels": k.what,
                         "needs_capability": capability_text(k.capability),
                         "compiler": k.compiler, "compiler_present": k.present})


def check_card(device: str, capability, precision: str, kernels: list[Kernels]) -> None:
    """Both checks, precision first (a bf16 kernel on a bf16-less card is a precision matter)."""
    check_precision(device, capability, precision)
    check_kernels(device, capability, kernels)
