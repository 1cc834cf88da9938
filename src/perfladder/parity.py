"""Copy a PyTorch GPT's weights into a Flax NNX GPT, so the two can be compared output for output.

This is the one perfladder module that needs both frameworks; nothing else imports it
(``perfladder/__init__`` does not), so ``import perfladder.torch`` and ``import
perfladder.jax`` stay single-framework.

The two models use the same parameter paths (CONTRIBUTING.md); only the leaf names and
one layout differ::

    torch module   torch leaf   flax leaf    layout
    Linear         weight       kernel       (out, in) -> (in, out): transposed
    Linear         bias         bias         as is
    LayerNorm      weight       scale        as is
    LayerNorm      bias         bias         as is
    Embedding      weight       embedding    as is (token_emb; pos_emb when pos='learned')

The copy is planned in full before anything is written: every torch parameter must map
to exactly one flax ``nnx.Param`` and every ``nnx.Param`` must receive exactly one torch
tensor, with equal shapes, or a ``ValueError`` says which parameter is the problem and the
flax model is left untouched.
"""
from __future__ import annotations

import dataclasses

import numpy as np

# torch module class name -> {torch leaf: (flax leaf, transpose?)}
LEAF_MAP = {
    "Linear": {"weight": ("kernel", True), "bias": ("bias", False)},
    "LayerNorm": {"weight": ("scale", False), "bias": ("bias", False)},
    "Embedding": {"weight": ("embedding", False)},
}


def _path(dotted: str) -> tuple:
    """'blks.0.attn.W_qkv' -> ('blks', 0, 'attn', 'W_qkv') (list indices become ints)."""
    return tuple(int(p) if p.isdigit() else p for p in dotted.split(".")) if dotted else ()


def _fmt(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _get(param):
    """A Param's value (concrete array, or ``ShapeDtypeStruct`` in an ``nnx.eval_shape`` model)."""
    return param.get_value() if hasattr(param, "get_value") else param.value


def _set(param, value) -> None:
    if hasattr(param, "set_value"):
        param.set_value(value)
    else:                                                     # older flax
        param.value = value


def _check_configs(torch_model, jax_model) -> None:
    tc, jc = getattr(torch_model, "config", None), getattr(jax_model, "config", None)
    if tc is None or jc is None or tc == jc:
        return
    if dataclasses.is_dataclass(tc) and dataclasses.is_dataclass(jc):
        diffs = [f"{f.name}: torch {getattr(tc, f.name)!r} vs jax {getattr(jc, f.name, None)!r}"
                 for f in dataclasses.fields(tc) if getattr(tc, f.name) != getattr(jc, f.name, None)]
    else:
        diffs = [f"torch {tc!r} vs jax {jc!r}"]
    raise ValueError("torch_to_jax: the two models are built from different configs; "
                     + "; ".join(diffs))


def torch_to_jax(torch_model, jax_model) -> int:
    """Write every parameter of ``torch_model`` into ``jax_model`` in place; return the count.

    ``torch_model`` is a ``perfladder.torch.GPT`` (a ``torch.compile`` wrapper is unwrapped),
    ``jax_model`` a ``perfladder.jax.GPT`` of the same ``GPTConfig``. Values are copied in
    fp32 and stored in the flax parameter's own dtype (its ``param_dtype``).

    ``jax_model`` may be abstract (built under ``nnx.eval_shape``, so no initialiser ran):
    every parameter is overwritten, so the result is a concrete model either way.
    """
    import jax.numpy as jnp
    import torch
    from flax import nnx

    torch_model = getattr(torch_model, "_orig_mod", torch_model)   # torch.compile wrapper
    if not isinstance(torch_model, torch.nn.Module):
        raise TypeError(f"torch_model must be a torch.nn.Module, got {type(torch_model).__name__}")
    if not isinstance(jax_model, nnx.Module):
        raise TypeError(f"jax_model must be a flax nnx.Module, got {type(jax_model).__name__}")
    _check_configs(torch_model, jax_model)

    targets = {tuple(path): node for path, node in nnx.iter_graph(jax_model)
               if isinstance(node, nnx.Param)}
    written: dict[tuple, str] = {}
    plan = []
    seen = set()                                            # tied tensors are listed once
    for mod_name, module in torch_model.named_modules():
        kind = type(module).__name__
        for leaf, tensor in module.named_parameters(recurse=False):
            torch_name = f"{mod_name}.{leaf}" if mod_name else leaf
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            if kind not in LEAF_MAP or leaf not in LEAF_MAP[kind]:
                raise ValueError(f"torch_to_jax: no rule for torch parameter {torch_name!r} "
                                 f"({kind}.{leaf}); rules exist for "
                                 f"{ {k: sorted(v) for k, v in LEAF_MAP.items()} }")
            flax_leaf, transpose = LEAF_MAP[kind][leaf]
            path = _path(mod_name) + (flax_leaf,)
            if path not in targets:
                raise ValueError(f"torch_to_jax: torch parameter {torch_name!r} maps to "
                                 f"{_fmt(path)!r}, which the jax model does not have")
            if path in written:
                raise ValueError(f"torch_to_jax: jax parameter {_fmt(path)!r} would be written "
                                 f"twice (from {written[path]!r} and {torch_name!r})")
            value = tensor.detach().to("cpu", torch.float32).numpy()
            if transpose:
                value = value.T                              # (out, in) -> (in, out)
            want = tuple(_get(targets[path]).shape)
            if value.shape != want:
                raise ValueError(
                    f"torch_to_jax: shape mismatch for {torch_name!r} -> {_fmt(path)!r}: "
                    f"torch {tuple(tensor.shape)}{' transposed to ' + str(value.shape) if transpose else ''}"
                    f" vs jax {want}")
            written[path] = torch_name
            plan.append((path, np.ascontiguousarray(value)))

    missing = sorted(_fmt(p) for p in targets if p not in written)
    if missing:
        raise ValueError(f"torch_to_jax: {len(missing)} jax parameter(s) have no torch "
                         f"counterpart and would keep their own initial values: {missing}")
    assert len(plan) == len(targets) == len(written)       # one write per nnx.Param

    for path, value in plan:
        param = targets[path]
        _set(param, jnp.asarray(value, dtype=_get(param).dtype))
    return len(plan)
