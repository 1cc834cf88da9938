"""Training steps, the precision receipts, and the correctness gates the rungs share.

Two ways to compile the same step:

* ``make_train_step()`` -- ``nnx.jit`` over ``step(model, optimizer, X, Y)``; the model and
  optimizer are updated in place. Each call walks the module graph in Python.
* ``make_split_step(model, optimizer)`` -- the Flax NNX performance-guide form: ``nnx.split``
  once, ``jax.jit`` a pure function of ``(graphdef, state)`` with the state donated, and
  ``nnx.merge`` inside. The caller holds the state; ``.commit()`` writes it back.
"""
from __future__ import annotations

import collections
import functools
import math
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

# Logit agreement is judged relative to the logits' scale: max |a - b| / max |b| <= tol
# (a tiny fresh model has logits of order 0.1, so an absolute tolerance would be toothless).
# Jit vs op-by-op: fusion re-associates sums (and on a GPU fp32 matmuls run as TF32), so
# agreement is loose. A checkpointed mirror runs the same arithmetic as its reference, so
# its agreement must be (nearly) exact.
PARITY_TOL = {"float32": 1e-2, "bfloat16": 5e-2}
MIRROR_TOL = {"float32": 1e-5, "bfloat16": 1e-2}


# -- loss and step -----------------------------------------------------------------------------
def loss_fn(model, X, Y, view: Callable | None = None, observe: dict | None = None):
    """Mean cross entropy, always in fp32 (logits are cast up before the softmax).

    ``observe``: passed to ``GPT.__call__`` (the dtypes the forward computes in)."""
    net = model if view is None else view(model)
    out = net(X) if observe is None else net(X, observe=observe)          # (B, T, V)
    logits = out.astype(jnp.float32)                                      # fp32 for the loss
    flat = logits.reshape(-1, logits.shape[-1])                           # (B*T, V)
    per_token = optax.softmax_cross_entropy_with_integer_labels(flat, Y.reshape(-1))  # (B*T,)
    return per_token.mean()


def train_step(model, optimizer, X, Y, view: Callable | None = None, observe: dict | None = None,
               receipts: dict | None = None):
    """One AdamW step; returns the loss. Gradients w.r.t. the (fp32) ``nnx.Param`` masters.

    ``observe`` (a dict owned by ``TrainStep``) and ``receipts`` (a dict owned by a jitted step
    of ``make_train_step``) receive, while the step is traced, the dtypes of the program being
    compiled, so a receipt describes what is timed.
    """
    if receipts is not None:
        record_receipt(receipts, model, X, view)
    # view and observe ride in the closure: as arguments of the transformed function they
    # would be flattened and rebuilt (a copy of ``observe`` would receive the dtypes)
    value, grads = nnx.value_and_grad(partial(loss_fn, view=view, observe=observe))(model, X, Y)
    optimizer.update(model, grads)
    return value


@functools.lru_cache(maxsize=None)
def adamw(lr: float) -> optax.GradientTransformation:
    """One ``optax.adamw`` object per learning rate.

    The transformation is static data of ``nnx.Optimizer``: two optimizers built from two
    separate ``optax.adamw(lr)`` calls compare unequal, and a jitted step would compile
    again for a fresh model. Sharing the (stateless) transformation avoids that.
    """
    return optax.adamw(lr)


def make_optimizer(model, lr: float = 1e-3) -> nnx.Optimizer:
    return nnx.Optimizer(model, adamw(float(lr)), wrt=nnx.Param)


def make_train_step(*, jit: bool = True, view: Callable | None = None) -> Callable:
    """``step(model, optimizer, X, Y) -> loss``; ``nnx.jit``-compiled unless ``jit=False``.

    ``view`` (optional) maps the model to the module the forward pass actually runs (the
    naive bf16 cast of rung R2a); gradients still flow to the original parameters.
    A jitted step carries ``step.receipts``: one dtype receipt per program it compiled,
    written while tracing (``step_receipt(step, model, X)`` reads the one for a model and batch).
    """
    if not jit:
        return partial(train_step, view=view) if view is not None else train_step
    receipts: dict = {}

    def step(model, optimizer, X, Y):
        return train_step(model, optimizer, X, Y, view, receipts=receipts)

    # the compiled module is named after the function: jit_train_step, as the kernel
    # attribution (perfladder.jax.kernels) and profiles expect
    step.__name__ = step.__qualname__ = "train_step"
    jitted = nnx.jit(step)
    jitted.receipts, jitted.view = receipts, view
    return jitted


def _pure_step(graphdef, view, state, X, Y, observe: dict | None = None):
    """One training step as a pure function of the split state: merge, step, split again."""
    model, optimizer = nnx.merge(graphdef, state)
    loss = train_step(model, optimizer, X, Y, view, observe, receipts=_SPLIT_RECEIPTS)
    return loss, nnx.state((model, optimizer))


# One jitted function for every SplitStep: a fresh model of a structure seen before (same
# graphdef, same view) reuses the compiled program instead of compiling it again. Its
# receipts, one per program it compiled, live next to it.
_SPLIT_RECEIPTS: dict = {}
_split_jit = jax.jit(_pure_step, static_argnums=(0, 1), donate_argnums=2)


class SplitStep:
    """A jitted ``(graphdef, state)`` step with donated state (Flax NNX performance guide).

    ``step = make_split_step(model, optimizer)``; ``loss = step(X, Y)`` advances the held
    state. The model's and optimizer's own arrays are donated on the first call, so call
    ``step.commit()`` before using ``model`` / ``optimizer`` again. ``observe`` (a dict)
    gives the step its own jitted function, which writes the forward's dtypes into it while
    it is traced.
    """

    def __init__(self, model, optimizer, view: Callable | None = None, observe: dict | None = None):
        self.model, self.optimizer, self.view = model, optimizer, view
        self.graphdef, self.state = nnx.split((model, optimizer))
        self._jit = _split_jit if observe is None else jax.jit(
            partial(_pure_step, observe=observe), static_argnums=(0, 1), donate_argnums=2)

    def __call__(self, X, Y):
        self._batch = X          # only its shape and dtype are read (``receipt``)
        loss, self.state = self._jit(self.graphdef, self.view, self.state, X, Y)
        return loss

    @property
    def receipt(self) -> dict | None:
        """The dtype receipt the compiled program of the last call recorded while it was traced
        (None before the first call)."""
        X = getattr(self, "_batch", None)
        return None if X is None else _SPLIT_RECEIPTS.get(_receipt_key(self.model, X, self.view))

    def lower(self, X, Y):
        return self._jit.lower(self.graphdef, self.view, self.state, X, Y)

    def commit(self):
        """Write the held state back into the model and optimizer; returns them."""
        nnx.update((self.model, self.optimizer), self.state)
        return self.model, self.optimizer


def make_split_step(model, optimizer, view: Callable | None = None) -> SplitStep:
    return SplitStep(model, optimizer, view)


# -- precision ----------------------------------------------------------------------------------
def cast_floating(tree, dtype):
    """Every floating array of a pytree cast to ``dtype`` (integers, keys untouched)."""
    def cast(a):
        return a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a
    return jax.tree.map(cast, tree)


def naive_bf16(model):
    """A copy of ``model`` whose floating arrays are bf16 -- and nothing else changed.

    The modules still remember ``dtype=float32`` from construction and cast every array
    they are handed back to it, so this copy computes in fp32 (rung R2a's lesson).
    """
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, cast_floating(state, jnp.bfloat16))


def receipt(model, X) -> str:
    """The dtype of the model's first activation (embedding output): what it computes in."""
    return str(model.embed(X).dtype)


def _eqns(jaxpr):
    """Every equation of a jaxpr, nested ones (jit, custom_jvp, remat, ...) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (list, tuple)) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _eqns(inner)


def matmul_dtypes(model, X) -> dict[str, int]:
    """Operand dtypes of every matmul (``dot_general``) in the traced forward pass.

    A stronger receipt than one activation: ``{'bfloat16': 13}`` means every matmul of the
    forward runs on bf16 operands.
    """
    graphdef, state = nnx.split(model)
    jaxpr = jax.make_jaxpr(lambda s, X: nnx.merge(graphdef, s)(X))(state, X)
    counts: collections.Counter = collections.Counter()
    for eqn in _eqns(jaxpr.jaxpr):
        if eqn.primitive.name == "dot_general":
            counts["+".join(sorted({str(v.aval.dtype) for v in eqn.invars}))] += 1
    return dict(counts)


def scatter_add_dtypes(model, X, Y) -> dict[str, int]:
    """Dtypes of the scatter-adds into the embedding table in the traced gradient (before XLA).

    The embedding's backward pass is a scatter-add of B*T rows into the V-row table; this
    says in which dtype the program asks for it (``embed_fp32`` moves it from bf16 to fp32).
    """
    table = tuple(model.token_emb.embedding.shape)                          # (V, D)
    graphdef, state = nnx.split(model)
    grad = jax.grad(lambda s: loss_fn(nnx.merge(graphdef, s), X, Y))
    counts: collections.Counter = collections.Counter()
    for eqn in _eqns(jax.make_jaxpr(grad)(state).jaxpr):
        out = eqn.outvars[0].aval if eqn.outvars else None
        if "scatter" in eqn.primitive.name and tuple(getattr(out, "shape", ())) == table:
            counts[str(out.dtype)] += 1
    return dict(counts)


# -- receipts recorded by the compiled step itself ------------------------------------------------
def _receipt_key(model, X, view) -> tuple:
    """What selects a compiled program of one jitted step: the model's structure (its graphdef,
    static attributes such as the compute dtype included), the view, the batch's shape and dtype."""
    return (nnx.graphdef(model), view, tuple(X.shape), str(X.dtype))


def record_receipt(receipts: dict, model, X, view: Callable | None = None) -> None:
    """While a training step is being traced: record what the program it compiles computes in.

    The receipt holds the dtype of the logits and of the first activation, and the operand
    dtypes of every matmul of the forward pass (``{'bfloat16': 13}``), read off the jaxpr of
    the very forward this step runs (the same module, view and batch, traced at the same
    moment). Outside a trace (an un-jitted step) it does nothing: no host work per step.
    """
    if not isinstance(X, jax.core.Tracer):
        return
    net = model if view is None else view(model)
    graphdef, state = nnx.split(net)
    logits = jax.make_jaxpr(lambda s, X: nnx.merge(graphdef, s)(X))(state, X)
    first = jax.make_jaxpr(lambda s, X: nnx.merge(graphdef, s).embed(X))(state, X)
    dots: collections.Counter = collections.Counter()
    for eqn in _eqns(logits.jaxpr):
        if eqn.primitive.name == "dot_general":
            dots["+".join(sorted({str(v.aval.dtype) for v in eqn.invars}))] += 1
    receipts[_receipt_key(model, X, view)] = {
        "logits": str(logits.out_avals[0].dtype), "first_activation": str(first.out_avals[0].dtype),
        "matmul_operands": dict(dots), "loss": "float32", "batch_shape": list(X.shape)}


def step_receipt(step, model=None, X=None) -> dict | None:
    """The receipt ``step`` recorded when it compiled its program for ``model``'s structure and
    ``X``'s shape (None if it never did). ``step``: a ``SplitStep`` (its last call's program;
    ``model`` and ``X`` not needed) or a jitted step of ``make_train_step``."""
    if isinstance(step, SplitStep):
        return step.receipt
    receipts = getattr(step, "receipts", None)
    if receipts is None:
        raise ValueError(f"{step!r} keeps no receipts: only a jitted step of make_train_step() "
                         "or a SplitStep records what it compiled")
    if model is None or X is None:
        raise ValueError("step_receipt of a make_train_step() step needs the model it steps and "
                         "a batch X of the timed shape")
    got = receipts.get(_receipt_key(model, X, getattr(step, "view", None)))
    return None if got is None else dict(got)


def param_dtypes(*trees) -> set[str]:
    """The dtypes of every floating array in the ``nnx.Param`` / optimizer state given."""
    out = set()
    for t in trees:
        for leaf in jax.tree.leaves(t):
            if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating):
                out.add(str(leaf.dtype))
    return out


def assert_fp32_masters(model, optimizer) -> None:
    """Parameters and AdamW moments must still be fp32 after a mixed-precision step."""
    params = nnx.state(model, nnx.Param)
    opt_state = nnx.state(optimizer, nnx.OptState) if hasattr(nnx, "OptState") else nnx.state(optimizer)
    for name, tree in (("parameters", params), ("optimizer state", opt_state)):
        dts = param_dtypes(tree)
        if dts != {"float32"}:
            raise AssertionError(f"fp32 masters broken: {name} hold dtypes {sorted(dts)}")


# -- correctness gates --------------------------------------------------------------------------
def _tol(dtype, table) -> float:
    return table.get(str(jnp.dtype(dtype)), table["bfloat16"])


def _compare(got, want, tol, what) -> float:
    """Relative disagreement ``max|got - want| / max|want|``; raises above ``tol``."""
    g, w = jnp.asarray(got, jnp.float32), jnp.asarray(want, jnp.float32)
    if g.shape != w.shape:
        raise AssertionError(f"{what}: logits shapes differ, {g.shape} vs {w.shape}")
    rel = float(jnp.max(jnp.abs(g - w)) / jnp.maximum(jnp.max(jnp.abs(w)), 1e-30))
    if not rel <= tol:
        raise AssertionError(f"{what}: logits differ, max|diff| / max|logits| = {rel:.3g} "
                             f"> allowed {tol:g}")
    return rel


def check_jit_parity(model, X, *, reference=None, tol: float | None = None) -> float:
    """R1's gate: ``nnx.jit``-compiled logits of ``model`` == op-by-op logits of ``reference``.

    ``reference`` defaults to ``model`` itself (a test passes a different, planted one).
    Returns ``max|diff| / max|logits|``; raises ``AssertionError`` above ``tol``
    (default by compute dtype, ``PARITY_TOL``).
    """
    reference = model if reference is None else reference
    compiled = nnx.jit(lambda m, X: m(X))(model, X)
    eager = reference(X)
    return _compare(compiled, eager, _tol(model.dtype, PARITY_TOL) if tol is None else tol,
                    "jit parity gate")


def with_checkpointing(model):
    """A mirror of ``model`` sharing its parameter values, with every block under remat."""
    graphdef, state = nnx.split(model)
    mirror = nnx.merge(graphdef, state)
    mirror.checkpoint = True
    return mirror


def _two_forwards(a, b, X):
    return a(X), b(X)


_two_forwards_jit = nnx.jit(_two_forwards)


def check_mirror(reference, mirror, X, *, tol: float | None = None) -> float:
    """R4's gate: the checkpointed model must compute the reference's logits.

    Both forwards run in one ``nnx.jit`` program (one compilation); remat must not change
    what the forward computes. Returns ``max|diff| / max|logits|``; raises above ``tol``.
    """
    got, want = _two_forwards_jit(mirror, reference, X)
    return _compare(got, want, _tol(reference.dtype, MIRROR_TOL) if tol is None else tol,
                    "checkpoint mirror")


# -- accounting ---------------------------------------------------------------------------------
def dot_flops(eqn) -> int:
    """FLOPs of one ``dot_general``: 2 x (batch x contracted x free dims of both operands)."""
    (_, rhs_contract), (_, rhs_batch) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    rhs_free = math.prod(d for i, d in enumerate(rhs) if i not in rhs_contract and i not in rhs_batch)
    return 2 * math.prod(lhs) * rhs_free


def traced_flops(model, X, Y) -> int:
    """Matmul FLOPs of one training step's forward and backward pass, read off the jaxpr.

    Every ``dot_general`` of the traced loss gradient is counted, so this checks the
    6N + 12LTD formula against the program the model really builds, and it sees what the
    formula leaves out (the forward that activation checkpointing recomputes, the one-hot
    embedding's extra matmul). It leaves out elementwise work, and anything hidden in a custom
    call (cuDNN attention). Why not XLA's ``cost_analysis()``: on a GPU the optimized program
    hands its matmuls to cuBLAS custom calls that the analysis does not count, and jax 0.11's
    GPU backend gives no count for the lowered, pre-optimization program at all.
    """
    graphdef, state = nnx.split(model)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (state, X, Y))
    grad = jax.value_and_grad(lambda s, X, Y: loss_fn(nnx.merge(graphdef, s), X, Y))
    return sum(dot_flops(eqn) for eqn in _eqns(jax.make_jaxpr(grad)(*shapes).jaxpr)
               if eqn.primitive.name == "dot_general")


def planned_temp_bytes(compiled) -> int | None:
    """Temporary buffer bytes the compiled program plans (``memory_analysis()``)."""
    ma = compiled.memory_analysis()
    if ma is None:
        return None
    return int(ma.temp_size_in_bytes)
