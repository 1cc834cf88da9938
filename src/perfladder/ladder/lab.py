"""The contract a framework's lab keeps with the engine and the pages: ``Lab``, and what its
``measure`` returns, ``Measured``. ``perfladder.torch.lab.TorchLab`` and
``perfladder.jax.lab.JaxLab`` implement it (``tests/ladder/test_lab.py`` checks both, members
and signatures). A lab's other members (``profile``, ``receipt``, ``stream``, ...) are its own
trial's business and differ by framework.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from perfladder.measure.evidence import Memory
from perfladder.measure.timing import Throughput
from perfladder.results.record import LadderResult


@dataclass(frozen=True)
class Measured:
    """A timed step: its ``throughput``, whether it was measured once more because its windows
    did not settle (``remeasured``), and the device memory the measurement saw (``memory``:
    PyTorch's measured peak; None where the framework reads its memory elsewhere, as JAX does
    from the compiler's plan)."""
    throughput: Throughput
    remeasured: bool
    memory: Memory | None = None


@runtime_checkable
class Lab(Protocol):
    """What the engine (``perfladder.ladder.engine``), the compile-ahead (``perfladder.ahead``)
    and the pages use of a lab: who it is, the result it fills, the technique code steps are
    built from, recipes and steps, the timer, and the fastest configuration's reports."""

    framework: str                  # 'torch' | 'jax': the results file's name, the pages' key
    config: Any                     # the LadderConfig it runs
    on_gpu: bool
    device_name: str
    result: LadderResult            # filled rung by rung by the engine
    seed_top: str                   # the last seed rung: beyond rungs build on it
    code: dict                      # the technique functions steps are built from

    def use(self, **code) -> None:
        """Replace technique functions (a notebook cell's own code)."""

    def seed_recipe(self) -> Any:
        """The recipe the ladder starts from."""

    def recipe_from_dict(self, d: dict) -> Any:
        """A recipe read back from a results file."""

    def build_step(self, recipe) -> Any:
        """A fresh step of ``recipe`` (new weights)."""

    def measure(self, step, batch_size: int) -> Measured:
        """``step`` timed on fresh batches of ``batch_size`` until its windows settle."""

    def precision(self, recipe) -> str:
        """What ``recipe``'s matmuls compute in: 'bf16', 'tf32' or 'fp32'."""

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token at ``seq_len``."""

    def free(self) -> None:
        """Let go of what the last rung held (device memory, compiled programs)."""

    def kernel_report(self, name: str, recipe) -> dict:
        """Where the fastest configuration's step time goes, kernel by kernel."""

    def learning_check(self, name: str, recipe, watch=None) -> Any:
        """Whether the fastest configuration learns (``perfladder.measure.learning``)."""
