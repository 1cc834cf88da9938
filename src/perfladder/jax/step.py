"""The JAX training step, and the chapter's techniques it is built from.

Each technique is a plain function, and each is what its rung's notebook cell shows (a test
keeps the two the same):

    train_step   R0   one AdamW step on the fp32 loss, gradients w.r.t. the fp32 parameters
    jit_step     R1   the whole step as one compiled XLA program (``nnx.jit``)
    cast_arrays  R2a  the naive cast: every floating array of a copy to bf16
    make_model   R2   bf16 threaded for real: the compute dtype every module remembers

(R4's, ``checkpoint_block``, runs inside the model: ``perfladder.jax.model``.) ``CODE`` names
them for ``JaxLab.use``, which lets a notebook cell pass its own version of any of them.

Two ways to compile the same step: ``make_train_step()`` (``nnx.jit`` over
``step(model, optimizer, X, Y)``; each call walks the module graph in Python) and
``make_split_step(model, optimizer)`` (the Flax NNX performance-guide form: ``nnx.split``
once, ``jax.jit`` a pure function of ``(graphdef, state)`` with the state donated, rung B3).
``TrainStep`` is a recipe's step, ready to time: while it is traced its forward writes the
dtypes it computes in into ``TrainStep.observed`` (``perfladder.jax.model.observing``), so the
precision receipt comes from the very program that is timed.
"""
from __future__ import annotations

import collections
import functools
import time
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from perfladder.jax.compile_options import WithOptions
from perfladder.jax.model import GPT, checkpoint_block, observing
from perfladder.jax.program import _eqns, dot_flops
from perfladder.jax.recipe import Recipe


# -- the techniques, in ladder order -----------------------------------------------------------
def loss_fn(model, X, Y, view: Callable | None = None):
    """Mean cross entropy, always in fp32 (logits are cast up before the softmax)."""
    net = model if view is None else view(model)
    logits = net(X).astype(jnp.float32)                                   # (B, T, V) fp32
    flat = logits.reshape(-1, logits.shape[-1])                           # (B*T, V)
    return optax.softmax_cross_entropy_with_integer_labels(flat, Y.reshape(-1)).mean()


def train_step(model, optimizer, X, Y, view=None):
    """R0: one AdamW step on the fp32 loss; gradients w.r.t. the fp32
    parameters (the masters). ``view``: what the forward runs instead
    of ``model`` (R2a's cast copy)."""
    loss, grads = nnx.value_and_grad(partial(loss_fn, view=view))(model, X, Y)
    optimizer.update(model, grads)
    return loss


def jit_step(step_fn):
    """R1: the whole step -- forward, gradients, AdamW update -- as one
    compiled program."""
    return nnx.jit(step_fn)


def cast_floating(tree, dtype):
    """Every floating array of a pytree cast to ``dtype`` (integers, keys untouched)."""
    def cast(a):
        return a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a
    return jax.tree.map(cast, tree)


def cast_arrays(model, dtype=jnp.bfloat16):
    """R2a: the naive move -- a copy of the model with every floating
    array cast to ``dtype``.

    The modules still remember ``dtype=float32`` from construction and
    cast every array they are handed back to it, so this copy computes
    in fp32 (the lesson of R2a)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, cast_floating(state, dtype))


def receipt(model, X) -> str:
    """The dtype of the model's first activation (embedding output): what it computes in."""
    return str(model.embed(X).dtype)


def make_model(config, dtype, seed=0, **options):
    """R2: every module computes in ``dtype``; the parameters stay fp32
    (the optimizer's masters)."""
    return GPT(config, rngs=nnx.Rngs(seed), dtype=dtype,
               param_dtype=jnp.float32, **options)


CODE = {f.__name__: f for f in (train_step, jit_step, cast_arrays, make_model, checkpoint_block)}


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
    written while tracing (``step_receipt(step, model, X)`` reads the one for a model and batch),
    the returned loss's dtype included.
    """
    if not jit:
        return partial(train_step, view=view) if view is not None else train_step
    receipts: dict = {}

    def step(model, optimizer, X, Y):
        record_receipt(receipts, model, X, view)
        loss = train_step(model, optimizer, X, Y, view)
        record_loss(receipts, model, X, view, loss)
        return loss

    # the compiled module is named after the function: jit_train_step, as the kernel
    # attribution (perfladder.jax.kernels) and profiles expect
    step.__name__ = step.__qualname__ = "train_step"
    jitted = nnx.jit(step)
    jitted.receipts, jitted.view = receipts, view
    return jitted


def _pure_step(graphdef, view, state, X, Y, observe: dict | None = None):
    """One training step as a pure function of the split state: merge, step, split again."""
    model, optimizer = nnx.merge(graphdef, state)
    record_receipt(_SPLIT_RECEIPTS, model, X, view)
    with observing(observe):
        loss = train_step(model, optimizer, X, Y, view)
    record_loss(_SPLIT_RECEIPTS, model, X, view, loss)
    if observe is not None:
        observe["loss"] = str(jnp.result_type(loss))
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

    def __init__(self, model, optimizer, view: Callable | None = None, observe: dict | None = None,
                 xla_options=()):
        self.model, self.optimizer, self.view = model, optimizer, view
        self.graphdef, self.state = nnx.split((model, optimizer))
        self.xla_options = dict(xla_options)         # XLA debug options (jax.compile_options)
        self._jit = _split_jit if observe is None and not xla_options else jax.jit(
            partial(_pure_step, observe=observe), static_argnums=(0, 1), donate_argnums=2,
            compiler_options=self.xla_options or None)

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
        "matmul_operands": dict(dots), "batch_shape": list(X.shape)}


def record_loss(receipts: dict, model, X, view, loss) -> None:
    """While a training step is being traced: the dtype of the loss it returns, read from the
    traced value itself (a loss computed in bf16 shows as bfloat16)."""
    key = _receipt_key(model, X, view)
    if isinstance(X, jax.core.Tracer) and key in receipts:
        receipts[key]["loss"] = str(jnp.result_type(loss))


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


@functools.lru_cache(maxsize=None)
def count_flops(gpt_config, seq_len: int) -> tuple[float, int]:
    """``(matmul FLOPs per token, parameters in no matmul)`` of the plain fp32 model's forward
    and backward at ``seq_len``: ``traced_flops`` of one sequence on an abstract model
    (``nnx.eval_shape``: shapes only, nothing computed or allocated)."""
    model = nnx.eval_shape(lambda: make_model(gpt_config, jnp.float32))
    X = jax.ShapeDtypeStruct((1, seq_len), jnp.int32)
    vector = sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)) if leaf.ndim < 2)
    return traced_flops(model, X, X) / seq_len, int(vector)


class TrainStep:
    """``loss = step(X, Y)`` advances ``model`` and ``optimizer`` by one AdamW step.

    ``jit``: 'none' (op by op), 'nnx' (``nnx.jit``; the model and optimizer are updated in
    place), 'split' (``nnx.split`` once, ``jax.jit`` with the state donated: call
    ``commit()`` before reading ``model`` / ``optimizer``). ``view``: what the forward runs
    (R2a's naive cast); gradients still reach the original parameters.
    """

    def __init__(self, model, optimizer, *, jit: str = "nnx", view=None, code: dict | None = None,
                 xla_options=()):
        code = {**CODE, **(code or {})}
        self.model, self.optimizer, self.jit = model, optimizer, jit
        self.observed: dict[str, str] = {}
        self.first_call_s: float | None = None
        self.compiled_ahead_s: float | None = None       # ``compile_ahead``'s seconds
        self.compiled = None      # what ``compile_ahead`` compiled (its plan: ``memory_analysis``)
        self._split = None
        step_fn = code["train_step"]

        observed = self.observed

        def body(model, optimizer, X, Y):
            loss = step_fn(model, optimizer, X, Y, view)
            observed["loss"] = str(jnp.result_type(loss))     # under jit: while traced
            return loss
        body.__name__ = body.__qualname__ = "train_step"     # the compiled module: jit_train_step
        if jit == "none":
            self._call = lambda X, Y: body(model, optimizer, X, Y)
        elif jit == "nnx":
            self._jitted = code["jit_step"](body)
            if xla_options:                   # each compile with them (jax.compile_options)
                self._jitted = WithOptions(self._jitted, xla_options)
            self._call = lambda X, Y: self._jitted(model, optimizer, X, Y)
        elif jit == "split":
            self._split = SplitStep(model, optimizer, view=view, observe=self.observed,
                                    xla_options=xla_options)
            self._call = self._split
        else:
            raise ValueError(f"jit={jit!r} is not valid; valid choices: ('none', 'nnx', 'split')")

    @classmethod
    def of(cls, model, optimizer, recipe: Recipe, code: dict | None = None) -> "TrainStep":
        code = {**CODE, **(code or {})}
        return cls(model, optimizer, jit=recipe.jit, code=code,
                   view=code["cast_arrays"] if recipe.naive_cast else None,
                   xla_options=recipe.xla_options)

    def __call__(self, X, Y):
        """One step; the first call (where a jitted step traces and compiles) times itself,
        between syncs, whoever makes it."""
        if self.first_call_s is not None:
            with observing(self.observed):
                return self._call(X, Y)
        t0 = time.perf_counter()
        with observing(self.observed):
            loss = jax.block_until_ready(self._call(X, Y))
        self.first_call_s = time.perf_counter() - t0
        return loss

    @property
    def jitted(self) -> bool:
        return self.jit != "none"

    def compile_ahead(self, X, Y) -> float:
        """Trace and compile the program a call on batches like ``(X, Y)`` runs, without running
        it (the model and optimizer are untouched): the first call then finds it compiled.
        Traced under ``observing``, as a call is, so the receipt is written. Returns and keeps
        (``compiled_ahead_s``) its seconds."""
        if self.first_call_s is not None:
            raise ValueError("compile_ahead is for a step that has not run yet: this one has")
        t0 = time.perf_counter()
        with observing(self.observed):
            self.compiled = self.lower(X, Y).compile()
        self.compiled_ahead_s = time.perf_counter() - t0
        return self.compiled_ahead_s

    def lower(self, X, Y):
        """``jax.stages.Lowered`` of this step for one batch (jitted steps only)."""
        if self.jit == "none":
            raise ValueError("an un-jitted step has no compiled program to lower")
        if self._split is not None:
            return self._split.lower(X, Y)
        if not hasattr(self._jitted, "lower"):
            raise ValueError(f"this step's jit_step returned {self._jitted!r}, which has no compiled "
                             "program to lower: a jitted rung needs a jitted step")
        return self._jitted.lower(self.model, self.optimizer, X, Y)

    def commit(self):
        """The trained ``(model, optimizer)`` (the split step's state written back first)."""
        if self._split is not None:
            self._split.commit()
        return self.model, self.optimizer

    def __repr__(self) -> str:
        return f"TrainStep(jit={self.jit!r}, observed={self.observed})"
