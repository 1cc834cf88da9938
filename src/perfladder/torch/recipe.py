"""``Recipe``: one PyTorch training configuration, seed or beyond (fp32 weights, fp32 loss).

A rung declares how it changes the recipe it builds on (``Rung.change``); the lab builds a
fresh model, optimizer and step from any recipe (``TorchLab.build_step``), and so does every
rank of a data-parallel launch (``perfladder.torch.parallel.worker``), from ``to_dict``'s JSON:
``GPT(config, **recipe.model_kw())``, ``make_step(model, optimizer, **recipe.step_kw())``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from perfladder.checks import check_int
from perfladder.torch.fused import NOT_TRITON, check_fused
from perfladder.torch.model import check_attn_backend, check_embed, check_residual
from perfladder.torch.step import CUDAGRAPH_MODES, OPTIMIZERS, check_mode


@dataclass(frozen=True)
class Recipe:
    batch_size: int
    compiled: bool = False           # torch.compile the model
    bf16: bool = False               # bf16 autocast (fp32 masters and loss)
    checkpoint: bool = False         # activation checkpointing per block
    optimizer: str = "default"       # steps.OPTIMIZERS: 'default' | 'fused' | 'compiled'
    cudagraphs: bool = False         # torch.compile(mode='reduce-overhead')
    embed: str = "gather"            # GPT(embed=...)
    attn_backend: str | None = None  # GPT(attn_backend=...): None lets PyTorch choose
    autotune: bool = False           # torch.compile(mode='max-autotune[-no-cudagraphs]')
    fused: tuple[str, ...] = ()      # GPT(fused=...): Triton kernels (perfladder.torch.fused)
    residual: str = "fp32"           # GPT(residual=...): the stream's dtype between blocks

    def __post_init__(self):
        check_int("batch_size", self.batch_size)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is not valid; valid choices: {OPTIMIZERS}")
        check_embed(self.embed)
        check_attn_backend(self.attn_backend)
        object.__setattr__(self, "fused", check_fused(tuple(self.fused)))
        check_residual(self.residual)
        if self.residual == "bf16" and not self.bf16:
            raise ValueError("residual='bf16' rounds the stream to bf16 under bf16 autocast: it "
                             "needs bf16=True")
        if (self.cudagraphs or self.autotune) and not self.compiled:
            raise ValueError("cudagraphs / autotune are torch.compile modes: they need compiled=True")

    @classmethod
    def seed(cls, config) -> "Recipe":
        """R0's configuration: eager fp32 (TF32 matmuls on a GPU) at the seed's batch."""
        return cls(batch_size=config.batch_size)

    def with_mode(self, mode: str | None) -> "Recipe":
        """This recipe compiled in ``torch.compile`` mode ``mode`` (``mode`` reads it back)."""
        mode = None if check_mode(mode) == "default" else mode
        return self.replace(compiled=True, cudagraphs=mode in CUDAGRAPH_MODES,
                            autotune=mode is not None and mode.startswith("max-autotune"))

    def model_kw(self) -> dict:
        """Keyword arguments of ``GPT(config, ...)``."""
        return dict(attn_backend=self.attn_backend, checkpoint=self.checkpoint, embed=self.embed,
                    fused=self.fused, residual=self.residual)

    def step_kw(self) -> dict:
        """Keyword arguments of ``make_step(model, optimizer, ...)`` beyond the device."""
        return dict(compiled=self.compiled, bf16=self.bf16, mode=self.mode,
                    compile_optimizer=self.optimizer == "compiled")

    @property
    def mode(self) -> str | None:
        """The ``torch.compile`` mode these switches amount to (None: the default mode)."""
        if self.autotune:
            return "max-autotune" if self.cudagraphs else "max-autotune-no-cudagraphs"
        return "reduce-overhead" if self.cudagraphs else None

    @property
    def graphs_over_cublaslt_plans(self) -> bool:
        """CUDA graphs replayed over GEMMs run through nvmath-python's cuBLASLt plans (fused
        'epilogue', 'gemm', 'gemm_bgrad'): a plan keeps its workspace between calls, and a
        workspace first allocated inside a CUDA-graph tree's pool is memory the tree refuses to
        record ("tensors in the cudagraph pool not tracked as outputs"). No rung runs it."""
        return self.cudagraphs and any(f in NOT_TRITON for f in self.fused)

    @property
    def precision(self) -> str:
        return "bf16" if self.bf16 else "fp32"

    def replace(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON types only (``fused`` a list): a result in memory equals its file read back."""
        return {**dataclasses.asdict(self), "fused": list(self.fused), "mode": self.mode}

    @classmethod
    def from_dict(cls, d: dict) -> "Recipe":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names - {"mode"})
        if unknown:
            raise ValueError(f"unknown recipe field(s) {unknown}; valid choices: {sorted(names)}")
        return cls(**{k: v for k, v in d.items() if k in names})

    def __str__(self) -> str:
        how = (f"compiled ({self.mode or 'default'} mode)" if self.compiled else "eager")
        return (f"{how}, {'bf16' if self.bf16 else 'fp32'}, batch {self.batch_size}"
                + (", checkpointed" if self.checkpoint else "")
                + f", {self.optimizer} AdamW, {self.embed} embedding, "
                f"{self.attn_backend or 'default'} attention"
                + (f", fused {'+'.join(self.fused)}" if self.fused else "")
                + (f", {self.residual} residual stream" if self.residual != "fp32" else ""))
