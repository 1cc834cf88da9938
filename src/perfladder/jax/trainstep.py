"""A recipe's training step, ready to time: ``TrainStep``.

The step owns its jitted function, so it is traced on its own first call, and while it is
traced its forward writes the dtypes it computes in (first activation, logits) into
``TrainStep.observed``: the precision receipt comes from the very program that is timed,
not from a second call beside it. (Un-jitted, every call writes them.)
"""
from __future__ import annotations

from flax import nnx

from perfladder.jax.recipe import Recipe
from perfladder.jax.step import SplitStep, naive_bf16, train_step


class TrainStep:
    """``loss = step(X, Y)`` advances ``model`` and ``optimizer`` by one AdamW step.

    ``jit``: 'none' (op by op), 'nnx' (``nnx.jit``; the model and optimizer are updated in
    place), 'split' (``nnx.split`` once, ``jax.jit`` with the state donated: call
    ``commit()`` before reading ``model`` / ``optimizer``). ``view``: what the forward runs
    (R2a's naive cast); gradients still reach the original parameters.
    """

    def __init__(self, model, optimizer, *, jit: str = "nnx", view=None):
        self.model, self.optimizer, self.jit = model, optimizer, jit
        self.observed: dict[str, str] = {}
        self._split = None
        observed = self.observed

        def body(model, optimizer, X, Y):
            return train_step(model, optimizer, X, Y, view, observed)
        body.__name__ = body.__qualname__ = "train_step"     # the compiled module: jit_train_step
        if jit == "none":
            self._call = lambda X, Y: body(model, optimizer, X, Y)
        elif jit == "nnx":
            self._jitted = nnx.jit(body)
            self._call = lambda X, Y: self._jitted(model, optimizer, X, Y)
        elif jit == "split":
            self._split = SplitStep(model, optimizer, view=view, observe=self.observed)
            self._call = self._split
        else:
            raise ValueError(f"jit={jit!r} is not valid; valid choices: ('none', 'nnx', 'split')")

    @classmethod
    def of(cls, model, optimizer, recipe: Recipe) -> "TrainStep":
        return cls(model, optimizer, jit=recipe.jit,
                   view=naive_bf16 if recipe.naive_cast else None)

    def __call__(self, X, Y):
        return self._call(X, Y)

    @property
    def jitted(self) -> bool:
        return self.jit != "none"

    def lower(self, X, Y):
        """``jax.stages.Lowered`` of this step for one batch (jitted steps only)."""
        if self.jit == "none":
            raise ValueError("an un-jitted step has no compiled program to lower")
        if self._split is not None:
            return self._split.lower(X, Y)
        return self._jitted.lower(self.model, self.optimizer, X, Y)

    def commit(self):
        """The trained ``(model, optimizer)`` (the split step's state written back first)."""
        if self._split is not None:
            self._split.commit()
        return self.model, self.optimizer

    def __repr__(self) -> str:
        return f"TrainStep(jit={self.jit!r}, observed={self.observed})"
