"""The state the JAX rungs share: data, streams, models, one jitted step, the growing result."""
from __future__ import annotations

import tempfile

import jax
import jax.numpy as jnp
from flax import nnx

from ..config import LadderConfig
from ..data import TimeMachine
from ..hardware import achieved_tflops, mfu, peak_for
from ..results import LadderResult, RungResult
from ..timing import Throughput
from .model import GPT
from .steps import make_optimizer, make_train_step
from .stream import batches
from .timer import device_name, has_gpu, throughput, versions

CACHE_NOTE = ("JAX's persistent compilation cache is on (a fresh folder for this process): a "
              "program compiled for its first call is loaded, not compiled again, when a rung "
              "lowers it once more for the compiler's plan; compiles stay outside timed windows")
EAGER_WINDOWS = 2   # R0 is a price list, not a baseline: two short windows are enough
PLAN_NOTE = ("peak_mem_bytes is the compiler's planned temporaries "
             "(lower(...).compile().memory_analysis().temp_size_in_bytes), not a measured peak")


class Ladder:
    """Everything the rungs of one JAX ladder run share.

    * ``data`` -- the corpus windows; ``stream(batch_size)`` -- one on-device stream per
      batch size, continued from rung to rung (fresh batches throughout);
    * ``model(name)`` -- the models the rungs hand on to each other (``'fp32'``: R1's, which
      R2a then casts; ``'bf16'``: R2's, which R3 and R4 continue), built on first use;
    * ``step`` -- one ``nnx.jit`` training step shared by every rung (a fresh model of a
      structure it has seen reuses the compiled program);
    * ``result`` -- the ``LadderResult`` each rung appends to; ``R1`` is the baseline;
    * ``fastest`` -- ``(rung name, perfladder.jax.beyond.Recipe)`` of the fastest
      configuration measured so far by the rungs that build on one another past R3
      (``None`` until a B rung wins: R3's configuration).
    """

    def __init__(self, config: LadderConfig, command: str = ""):
        if not isinstance(config, LadderConfig):
            raise TypeError(f"config must be a perfladder.config.LadderConfig, got {type(config).__name__}")
        self.config = config
        cached = _compile_cache_on_gpu()
        self.data = TimeMachine(config.batch_size, config.num_steps, num_train=config.num_train,
                                num_val=config.num_val)
        self.gpt_config = config.gpt(vocab_size=len(self.data.vocab))
        self.device = device_name()
        self.gpu = has_gpu()
        peak = peak_for(self.device)
        self.result = LadderResult(
            framework="jax", device=self.device, config=config.to_dict(), baseline="R1",
            versions=versions(), command=command,
            peak_tflops=None if peak is None else {"bf16": peak.bf16, "tf32": peak.tf32,
                                                   "measured_bf16": peak.measured_bf16})
        if not self.gpu:
            self.result.notes.append("run on CPU: fp32 matmuls are plain fp32 (no TF32), MFU is "
                                     "not applicable, cudnn attention is not available")
        if cached:
            self.result.notes.append(CACHE_NOTE)
        self.step = make_train_step()
        self.fastest = None
        self.models: dict[str, tuple] = {}
        self.plans: dict[str, int | None] = {}     # rung -> planned temp bytes
        self._streams: dict[int, object] = {}

    # -- building blocks ---------------------------------------------------------------------
    def build(self, dtype=jnp.float32, **model_kw):
        """A fresh model (always the same init: ``nnx.Rngs(config.seed)``, fp32 masters) and its AdamW."""
        model = self.make_model(dtype, **model_kw)
        return model, make_optimizer(model, self.config.lr)

    def make_model(self, dtype=jnp.float32, **model_kw) -> GPT:
        """A fresh model alone (same init as ``build``), e.g. to inspect it."""
        return GPT(self.gpt_config, rngs=nnx.Rngs(self.config.seed), dtype=dtype,
                   param_dtype=jnp.float32, **model_kw)

    def model(self, name: str):
        """The shared ``(model, optimizer)`` called ``name`` ('fp32' or 'bf16'), built if missing."""
        dtypes = {"fp32": jnp.float32, "bf16": jnp.bfloat16}
        if name not in dtypes:
            raise ValueError(f"unknown shared model {name!r}; valid choices: {tuple(dtypes)}")
        if name not in self.models:
            self.models[name] = self.build(dtypes[name])
        return self.models[name]

    def stream(self, batch_size: int):
        if batch_size not in self._streams:
            self._streams[batch_size] = batches(self.data, batch_size,
                                                seed=self.config.seed + len(self._streams))
        return self._streams[batch_size]

    def time(self, step, stream, eager: bool = False) -> Throughput:
        c = self.config
        if eager:   # un-jitted: nothing to compile past, so one warm-up step and short windows
            return throughput(step, stream, warmup=1, timed=c.eager_timed, windows=EAGER_WINDOWS)
        return throughput(step, stream, warmup=c.warmup, timed=c.timed, windows=c.windows)

    def precision(self, dtype) -> str:
        """The label of what the matmuls run in: 'bf16', or 'tf32' (fp32 on a GPU), or 'fp32' (CPU)."""
        if jnp.dtype(dtype) == jnp.bfloat16:
            return "bf16"
        return "tf32" if self.gpu else "fp32"

    def plan(self, model, optimizer, X, Y, step=None, text: bool = False):
        """``(traced_flops_per_step, planned_temp_bytes)`` of the step, plus the compiled
        program's optimized HLO text as a third element when ``text``."""
        from .steps import planned_temp_bytes, traced_flops
        compiled = (step or self.step).lower(model, optimizer, X, Y).compile()
        out = (traced_flops(model, X, Y), planned_temp_bytes(compiled))
        return out + (compiled.as_text(),) if text else out

    # -- recording ---------------------------------------------------------------------------
    def record(self, name: str, label: str, t: Throughput, *, model, dtype, kind: str = "rung",
               mem: int | None = None, notes=(), extra=None, prev: str | None = None) -> RungResult:
        """Turn a measurement into a ``RungResult`` and append it to ``result``.

        ``prev`` names the rung this one builds on (its ``ratio_prev``); by default the last
        waterfall rung.
        """
        batch, seq = t.batch_shape[0], t.batch_shape[1]
        fpt = model.flops_per_token(seq)
        precision = self.precision(dtype)
        peak_precision = "bf16" if precision == "bf16" else "tf32"
        notes = list(notes)
        if mem is not None:
            notes.append(PLAN_NOTE)
        extra = dict(extra or {})
        extra.update(step_ms=1e3 * t.step_time_s, seconds=t.seconds, warmup=t.warmup,
                     steps_per_window=t.steps_per_window, model_flops_per_token=fpt)
        r = RungResult(name=name, label=label, tokens_per_s=t.tokens_per_s, windows=list(t.windows),
                       spread=t.spread, batch_size=batch, seq_len=seq, precision=precision,
                       kind=kind, tflops=achieved_tflops(t.tokens_per_s, fpt),
                       mfu=mfu(t.tokens_per_s, fpt, self.device, peak_precision),
                       peak_mem_bytes=mem, notes=notes, extra=extra)
        if r.mfu is None:
            r.notes.append(f"MFU not applicable: no peak FLOP/s known for device {self.device!r}")
        return self.result.add(r, prev=prev)

    def skip(self, name: str, label: str, note: str, kind: str = "skipped", extra=None) -> RungResult:
        return self.result.add(RungResult(name=name, label=label, tokens_per_s=None, kind=kind,
                                          notes=[note], extra=dict(extra or {})))


def _compile_cache_on_gpu() -> bool:
    """On a GPU, turn JAX's persistent compilation cache on in a fresh folder (if nothing set one).

    Every rung compiles its step for the first call and then once more through
    ``lower(...).compile()`` for the compiler's plan (FLOPs, temporaries); with the cache the
    second is a load. Nothing timed changes: the executable is the same and compiles happen
    in warm-up. It takes effect only if this process has not compiled anything yet.
    """
    if not has_gpu() or getattr(jax.config, "jax_compilation_cache_dir", None):
        return False
    jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="perfladder-jax-cache-"))
    return True


def first_batch(stream):
    """One batch to lower / gate with (drawn from the stream, so never re-timed)."""
    X, Y = next(stream)
    return jax.block_until_ready(X), jax.block_until_ready(Y)
