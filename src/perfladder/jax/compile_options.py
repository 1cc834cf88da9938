"""XLA debug options for one program's compile, not the process's.

``XLA_FLAGS`` is read once, when JAX starts its backend (``perfladder.jax.compiler``), so it
cannot differ between two rungs of one ladder. ``jax.jit(..., compiler_options={...})`` hands
XLA debug options to each compile of that one function instead: a rung's recipe names them
(``Recipe.xla_options``), and its step and its gate programs compile with them. XLA refuses an
option name it does not know, or a value it cannot parse, when the program compiles
(``INVALID_ARGUMENT: No such compile option``); the recipe refuses, before anything compiles,
anything that is not a name starting ``xla_`` with a bool, int, float or str value.

The options of the rungs that set them:

* ``CUBLASLT``: XLA's GEMMs through cuBLASLt, whose epilogues XLA's GEMM rewriter can give a
  matmul's bias add and GELU (``dot + bias -> gelu`` becomes one cuBLASLt call).
* ``COMMAND_BUFFERS``: every command type of one device that XLA can record into CUDA graphs
  (collectives left out), recorded from the smallest sequence (one kernel), so that more of the
  step's launches are replayed as graphs. Compile options take the whole list: XLA_FLAGS's
  ``+TYPE`` / ``-TYPE`` edits of the default list are refused here.
"""
from __future__ import annotations

CUBLASLT = {"xla_gpu_enable_cublaslt": True}
COMMAND_BUFFER_TYPES = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL"
COMMAND_BUFFERS = {"xla_gpu_enable_command_buffer": COMMAND_BUFFER_TYPES,
                   "xla_gpu_graph_min_graph_size": 1}
_VALUE_TYPES = (bool, int, float, str)


def check_xla_options(options) -> tuple[tuple[str, object], ...]:
    """``options`` (a mapping or ``(name, value)`` pairs) as sorted pairs, or one clear error
    naming the bad entry."""
    if isinstance(options, dict):
        pairs = list(options.items())
    elif isinstance(options, (tuple, list)) and all(isinstance(p, (tuple, list)) and len(p) == 2
                                                     for p in options):
        pairs = [tuple(p) for p in options]
    else:
        raise ValueError(f"xla_options={options!r} must be a dict of XLA option names to values")
    for name, value in pairs:
        if not isinstance(name, str) or not name.startswith("xla_"):
            raise ValueError(f"xla_options name {name!r} is not an XLA debug option; valid "
                             "choices: names starting 'xla_' (e.g. 'xla_gpu_enable_cublaslt')")
        if not isinstance(value, _VALUE_TYPES):
            raise ValueError(f"xla_options {name}={value!r} must be a bool, int, float or str")
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"xla_options names an option twice: {sorted(names)}")
    return tuple(sorted((n, v) for n, v in pairs))


def merged(base: dict, options) -> dict:
    """``base``'s compiler options with ``options`` (pairs or a dict) over them."""
    return {**base, **dict(options)}


class WithOptions:
    """``jitted`` (an ``nnx.jit`` or ``jax.jit`` step) whose every compile gets ``options``:
    called, it compiles once per batch shape with them (``lower(...).compile(options)``, the
    same program the jitted step would compile) and calls the compiled step, which updates an
    ``nnx.jit`` step's model and optimizer in place as the jitted call does. ``lower`` returns
    the step's own lowering, whose ``compile()`` gets the options too (a compile ahead of the
    first call is the one the call then runs)."""

    def __init__(self, jitted, options):
        if not hasattr(jitted, "lower"):
            raise ValueError(f"xla_options need a jitted step with a compiled program to lower; "
                             f"got {jitted!r}")
        self.jitted, self.xla_options = jitted, dict(check_xla_options(options))
        self._compiled: dict = {}

    def lower(self, *args):
        return _Lowered(self.jitted.lower(*args), self, _signature(args))

    def __call__(self, *args):
        compiled = self._compiled.get(_signature(args))
        if compiled is None:
            compiled = self.lower(*args).compile()
        return compiled(*args)


def _signature(args) -> tuple:
    """What selects a compiled program among a step's calls: its array arguments' shapes and
    dtypes (the model and optimizer of one step keep their structure)."""
    return tuple((tuple(a.shape), str(a.dtype)) for a in args if hasattr(a, "shape"))


class _Lowered:
    def __init__(self, lowered, owner: WithOptions, signature: tuple):
        self._lowered, self._owner, self._signature = lowered, owner, signature

    def compile(self):
        compiled = self._lowered.compile(self._owner.xla_options)
        self._owner._compiled.setdefault(self._signature, compiled)
        return compiled

    def __getattr__(self, name):
        return getattr(self._lowered, name)
