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
* ``COMMAND_BUFFERS``: every command type XLA can record into CUDA graphs, recorded from the
  smallest sequence (one kernel), so that more of the step's launches are replayed as graphs.
"""
from __future__ import annotations

CUBLASLT = {"xla_gpu_enable_cublaslt": True}
COMMAND_BUFFER_TYPES = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
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
