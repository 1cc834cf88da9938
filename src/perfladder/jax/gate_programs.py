"""The programs the JAX gates compile: a model's (or a training step's own) loss, logits and
gradients, as ``perfladder.jax.gates`` compares them, and the optimizer gate's reference step;
``gate_jit`` also compiles the learning check's judge (``perfladder.jax.evaluate``). Each has a
``compile_...`` twin that compiles it without running it (``perfladder.jax.beside``).

They are compiled without XLA's GEMM autotuning (``GATE_COMPILE``): a gate or a judge needs the
arithmetic, not the fastest kernels, and autotuning times candidate kernels for shapes (the
gate's 8 rows, the judge's evaluation batch) that no timed step runs. The timed steps are
compiled as their rungs build them, autotuning included.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from perfladder.jax.step import train_step
from perfladder.measure.gates import ModelGateError

# XLA debug options of every gate program (ignored by the CPU compiler)
GATE_COMPILE = {"xla_gpu_autotune_level": 0}


def gate_jit(fn, static: tuple[int, ...] = (), xla_options=()):
    """``fn(model, *args)`` compiled as a pure function of the model's graph and state, with
    ``GATE_COMPILE`` (and a rung's ``xla_options`` over it); ``static``: the positions in
    ``args`` of hashable, static arguments. The model is read, not updated (a gate's programs
    change no state)."""
    @functools.partial(jax.jit, static_argnums=(0, *(2 + i for i in static)),
                       compiler_options={**GATE_COMPILE, **dict(xla_options)})
    def pure(graphdef, state, *args):
        return fn(nnx.merge(graphdef, state), *args)

    def run(model, *args):
        graphdef, state = nnx.split(model)
        return pure(graphdef, state, *args)

    def lower(model, *args):
        graphdef, state = nnx.split(model)
        return pure.lower(graphdef, state, *args)
    run.lower = lower
    return run


def _stepped_state(graphdef, state, X, Y):
    model, optimizer = nnx.merge(graphdef, state)
    train_step(model, optimizer, X, Y)
    return nnx.state((model, optimizer))


_reference_step_jit = jax.jit(_stepped_state, static_argnums=0, compiler_options=GATE_COMPILE)


def reference_step(model, optimizer, X, Y) -> None:
    """One step of the library's ``train_step`` (AdamW on the fp32 loss) on ``model`` and
    ``optimizer``, in place: the optimizer gate's reference, compiled as a gate program."""
    graphdef, state = nnx.split((model, optimizer))
    nnx.update((model, optimizer), _reference_step_jit(graphdef, state, X, Y))


def compile_reference_step(model, optimizer, X, Y) -> None:
    """Compile, without running, the program ``reference_step`` runs for these shapes."""
    graphdef, state = nnx.split((model, optimizer))
    _reference_step_jit.lower(graphdef, state, X, Y).compile()


def named(tree) -> dict:
    """``{'blks.0.attn.W_qkv.kernel': array, ...}`` from an ``nnx.State`` of parameters."""
    return {".".join(map(str, path)): v[...] if isinstance(v, nnx.Variable) else v
            for path, v in nnx.to_flat_state(tree)}


def _loss_and_logits(model, X, Y, view):
    net = model if view is None else view(model)
    logits = net(X)                                                        # (B, T, V)
    flat = logits.astype(jnp.float32).reshape(-1, logits.shape[-1])       # (B*T, V) fp32
    loss = optax.softmax_cross_entropy_with_integer_labels(flat, Y.reshape(-1)).mean()
    return loss, logits


def _grads(model, X, Y, view):
    """Loss, logits and the gradient w.r.t. every ``nnx.Param``: the step without its update."""
    (loss, logits), grads = nnx.value_and_grad(_loss_and_logits, has_aux=True)(model, X, Y, view)
    return loss, logits, grads


_grads_jit = gate_jit(_grads, static=(2,))                   # model, X, Y, view


class _Capture:       # the optimizer a step is handed: keeps its gradients, applies nothing
    def update(self, *model_and_grads):
        self.grads = model_and_grads[-1]


def step_gradients(step_fn, model, X, Y, view=None):
    """``(loss, logits, gradients)`` as ``step_fn(model, optimizer, X, Y, view)`` -- a training
    step such as the lab's ``train_step`` technique -- computes them: its own loss, its
    gradients caught at ``optimizer.update``; the logits from the same forward module."""
    capture = _Capture()
    loss = step_fn(model, capture, X, Y, view)
    if not hasattr(capture, "grads"):
        raise ModelGateError(f"{getattr(step_fn, '__name__', step_fn)!r} never handed its "
                             "gradients to optimizer.update: the step applies no update",
                             gate="model gate")
    logits = (model if view is None else view(model))(X)
    return loss, logits, capture.grads


@functools.lru_cache(maxsize=None)
def _step_gradients_jit(xla_options=()):
    """The step's own gradients as a gate program, one per set of a rung's XLA options."""
    return gate_jit(lambda model, X, Y, view, step_fn: step_gradients(step_fn, model, X, Y, view),
                    static=(2, 3), xla_options=xla_options)   # model, X, Y, view, step_fn


def compile_gradients(model, X, Y, view=None, step_fn=None, xla_options=()) -> None:
    """Compile, without running, the program ``gradients(model, X, Y, view, step_fn=step_fn)``
    runs (one chunk, compiled), so that its call finds it compiled."""
    if step_fn is None:
        _grads_jit.lower(model, X, Y, view).compile()
    else:
        _step_gradients_jit(tuple(xla_options)).lower(model, X, Y, view, step_fn).compile()


def gradients(model, X, Y, view=None, chunks: int = 1, jit: bool = True, step_fn=None,
              with_loss: bool = False, xla_options=()):
    """``(logits as fp32 numpy, {parameter name: gradient})`` of the mean cross entropy on
    ``(X, Y)``, compiled (``jit``) or op by op; with ``with_loss``, ``(loss, logits, grads)``.
    ``step_fn``: the loss and gradients are that training step's own (``step_gradients``),
    compiled with ``xla_options`` (a rung's XLA debug options: ``Recipe.xla_options``).
    ``chunks`` > 1 splits the batch into that many equal parts and averages their
    gradients: the same mean over the whole batch, computed at a smaller batch."""
    B = X.shape[0]
    if not isinstance(chunks, int) or chunks < 1 or B % chunks:
        raise ValueError(f"chunks={chunks!r} must be a positive integer dividing the batch {B}")
    n = B // chunks
    logits, total, loss = [], None, 0.0
    run = _grads_jit if jit else _grads
    for i in range(chunks):
        Xi, Yi = X[i * n:(i + 1) * n], Y[i * n:(i + 1) * n]
        if step_fn is None:
            lo, lg, g = run(model, Xi, Yi, view)                                # (n, T, V), ...
        else:
            lo, lg, g = (_step_gradients_jit(tuple(xla_options))(model, Xi, Yi, view, step_fn) if jit
                         else step_gradients(step_fn, model, Xi, Yi, view))
        logits.append(np.asarray(lg.astype(jnp.float32)))
        loss += float(lo) / chunks
        g = {k: np.asarray(v, np.float64) for k, v in named(g).items()}
        total = g if total is None else {k: total[k] + g[k] for k in total}
    grads = {k: v / chunks for k, v in total.items()}
    return (loss, np.concatenate(logits), grads) if with_loss else (np.concatenate(logits), grads)
