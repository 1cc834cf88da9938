"""One training configuration of the JAX ladder, as data: a ``Recipe``.

Every rung, seed or beyond, is a recipe: R0 is the un-jitted fp32 step at the seed batch,
R1 the same under ``nnx.jit``, and each later rung changes one field of the recipe it
builds on (``Rung.change``). ``JaxLab.build_step(recipe)`` turns a recipe into a model, its
AdamW and a step; nothing else decides how a rung's step is made.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from perfladder.checks import check_int
from perfladder.jax.compile_options import check_xla_options
from perfladder.jax.fused import check_fused
from perfladder.jax.model import ATTN_IMPLS, EMBEDS

JITS = ("none", "nnx", "split")           # un-jitted, nnx.jit, split/merge jax.jit with donation
DTYPES = ("float32", "bfloat16")          # compute dtype of every module (parameters stay fp32)


@dataclass(frozen=True)
class Recipe:
    """How one step is built and run.

    ``naive_cast``: the fp32 model with its floating arrays cast to bf16 before the forward
    (rung R2a); the modules still compute in their construction dtype.
    ``embed_fp32``: look tokens up in the fp32 table (the gradient's scatter-add in fp32).
    """
    batch_size: int
    jit: str = "nnx"
    dtype: str = "float32"
    naive_cast: bool = False
    checkpoint: bool = False
    embed: str = "gather"
    embed_fp32: bool = False
    attn_impl: str | None = None
    fused: tuple[str, ...] = ()          # GPT(fused=...): Pallas kernels (perfladder.jax.fused)
    # XLA debug options of the jitted step's compiles: perfladder.jax.compile_options
    xla_options: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "fused", check_fused(self.fused))
        object.__setattr__(self, "xla_options", check_xla_options(self.xla_options))
        check_int("Recipe batch_size", self.batch_size)
        for name, valid in (("jit", JITS), ("dtype", DTYPES), ("embed", EMBEDS),
                            ("attn_impl", ATTN_IMPLS)):
            v = getattr(self, name)
            if v not in valid:
                raise ValueError(f"Recipe {name}={v!r} is not valid; valid choices: {valid}")
        for name in ("naive_cast", "checkpoint", "embed_fp32"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Recipe {name}={getattr(self, name)!r} must be True or False")
        if self.naive_cast and self.dtype != "float32":
            raise ValueError(f"Recipe naive_cast=True casts the fp32 model; dtype={self.dtype!r} "
                             "must be 'float32'")
        if "attention" in self.fused and self.attn_impl is not None:
            raise ValueError(f"Recipe fused 'attention' replaces jax.nn.dot_product_attention: "
                             f"attn_impl must be None, got {self.attn_impl!r}")
        if self.xla_options and self.jit == "none":
            raise ValueError("Recipe xla_options are options of a compile: jit must be 'nnx' or "
                             "'split', got 'none'")
        if self.attn_impl == "cudnn" and self.dtype != "bfloat16":
            raise ValueError(f"Recipe attn_impl='cudnn' needs dtype='bfloat16', got {self.dtype!r}")

    @classmethod
    def seed(cls, config) -> "Recipe":
        """R0's configuration: the un-jitted fp32 step at the seed batch."""
        return cls(batch_size=config.batch_size, jit="none", dtype="float32")

    @property
    def bf16(self) -> bool:
        """Do the modules compute in bf16? (the naive cast does not: its modules cast back)"""
        return self.dtype == "bfloat16"

    def model_kw(self) -> dict:
        """Keyword arguments of ``GPT(...)`` beyond the config and the dtype."""
        return dict(checkpoint=self.checkpoint, embed=self.embed, embed_fp32=self.embed_fp32,
                    attn_impl=self.attn_impl, fused=self.fused)

    @property
    def precision(self) -> str:
        return "bf16" if self.dtype == "bfloat16" else "fp32"

    def replace(self, **changes) -> "Recipe":
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"Recipe has no field(s) {unknown}; valid choices: "
                             f"{[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON types only (``fused`` a list): a result in memory equals its file read back."""
        return {**dataclasses.asdict(self), "fused": list(self.fused),
                "xla_options": dict(self.xla_options)}

    @classmethod
    def from_dict(cls, d: dict) -> "Recipe":
        if not isinstance(d, dict):
            raise TypeError(f"Recipe.from_dict needs a dict, got {type(d).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"Recipe has no field(s) {unknown}; valid choices: {names}")
        return cls(**d)

    def __str__(self) -> str:
        if self.naive_cast:
            precision = "fp32 model, arrays cast to bf16"
        else:
            precision = "bf16" if self.bf16 else "fp32"
        lookup = "fp32" if self.embed_fp32 else ("bf16" if self.bf16 else "fp32")
        step = {"none": "un-jitted", "nnx": "nnx.jit", "split": "split/merge jax.jit"}[self.jit]
        parts = [precision, f"batch {self.batch_size}", f"{self.embed} embedding ({lookup} lookup)",
                 f"{self.attn_impl or 'xla'} attention", f"{step} step"]
        if self.checkpoint:
            parts.append("checkpointed blocks")
        if self.fused:
            parts.append(f"fused {'+'.join(self.fused)}")
        if self.xla_options:
            parts.append("XLA " + " ".join(f"{k}={v}" for k, v in self.xla_options))
        return ", ".join(parts)
