"""Rungs past the seed chapter: ``B1``, ``B2``, ... continue the PyTorch waterfall from R3.

R3 (compiled, bf16 autocast, the big batch) is where the seed recipe stops. On the H200 it
runs at roughly a third of the measured bf16 peak, so most of each step is not tensor-core
arithmetic. Before the first B rung the seed recipe is profiled once more, kernel by kernel
(``kernel_breakdown``), and every rung's first note quotes the part of that profile it goes
after, with the regime: launch overhead, memory bandwidth, compute, or memory capacity.

    B1  fused AdamW (``fused=True``)                        optimizer: many small kernels
    B2  the default AdamW, its step torch.compile-d         the alternative to B1
    B3  CUDA graphs (``mode='reduce-overhead'``)            launch overhead; CUDA only
    B4  scatter-free embedding (``GPT(embed='onehot')``)    the embedding gradient's atomics
    B5  batch x2                                            bigger GEMMs, fixed costs amortised
    B6  batch x4
    B7  the fastest attention kernel, pinned                measured per backend first
    B8  ``max-autotune`` GEMM templates (not run by default: long compiles; GPU only)

How they chain. Each rung takes the fastest configuration measured so far (a ``Recipe``:
R3's until a B rung beats it), changes one thing, gates the change, measures it, and records
it with ``prev=`` the rung it builds on. A rung that wins becomes what the next one builds
on; one that loses stays in the waterfall as a bar below its predecessor, and the next rung
builds on the previous winner again (``Ladder.fastest`` holds the winner). In the smoke
config the CPU numbers mean nothing, so they do not decide: every added technique is kept, a
choice between two implementations of the same thing (B2's optimizer, B7's attention kernel)
is not, and a smoke run always compiles the same configurations.

The gate. Before timing, the rung's own step runs ``GATE_STEPS`` optimizer steps from the
ladder's initial weights on fixed batches; its losses must equal those of the seed recipe
(bf16 autocast, gather embedding, PyTorch's default AdamW and attention) run eagerly on the
same batches, within ``LOSS_ATOL``, and at the big batch also those of the compiled R3 recipe.
Speed that breaks the model is not speed.

A technique that fails at run time (a backend refusing the shape, memory running out, a gate
failing) is recorded as ``kind='skipped'`` with the error in its notes, printed, and the
ladder goes on: nothing is measured for it, and nothing else is measured under its name.
A technique that does not exist on the device (CUDA graphs and Triton GEMM templates on CPU)
is a 'skipped' rung that says so.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from ..kernels import KernelBreakdown
from ..results import RungResult
from .gates import GateError, MirrorError, check_bf16
from .kernels import kernel_breakdown
from .ladder import Ladder
from .model import ATTN_BACKENDS, check_attn_backend, check_embed
from .profile import _drop_kineto_trace_lines
from .steps import OPTIMIZERS, TrainStep
from .stream import batches
from .timer import sync

SEED_TOP = "R3"            # the seed rung the B rungs continue from
GATE_STEPS = 3             # optimizer steps the loss gate runs from the initial weights
# Loss gate tolerance (absolute, on a loss of ~3.3). Switches that only reorder bf16 kernels
# (compiled vs eager, fused vs foreach AdamW) moved the loss of these first steps by <= 1.2e-3
# on the full-width model (CPU, batch 8), fp32 vs bf16 by <= 3.5e-3; in the same steps the loss
# itself moves by tenths to units (3.45 -> 3.68 -> 5.30 on the H200, run 1), so a step that
# skips or garbles the update misses by far more than 2e-2.
LOSS_ATOL = 2e-2
EMBED_ATOL = 1e-6          # one-hot vs gather logits, true fp32: every product is 1*w or 0*w
EMBED_GRAD_RTOL = 1e-4     # their table gradients: the same sums in a different order
GATE_SEED_OFFSET = 10_000  # the gate's batches come from their own shuffle seed
BACKENDS = ("flash", "efficient", "cudnn", "math")   # SDPA kernels B7 measures
SCATTER_KERNELS = re.compile(r"embedding|index_put|scatter", re.IGNORECASE)


class LossGateError(GateError):
    """A beyond configuration's first losses differ from the seed recipe's on the same batches."""


# -- what a rung measures -------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    """One training configuration of the compiled bf16 model (fp32 weights, fp32 loss)."""
    batch_size: int
    optimizer: str = "default"       # steps.OPTIMIZERS: 'default' | 'fused' | 'compiled'
    cudagraphs: bool = False         # torch.compile(mode='reduce-overhead')
    embed: str = "gather"            # GPT(embed=...)
    attn_backend: str | None = None  # GPT(attn_backend=...): None lets PyTorch choose
    autotune: bool = False           # torch.compile(mode='max-autotune[-no-cudagraphs]')

    def __post_init__(self):
        b = self.batch_size
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise ValueError(f"batch_size={b!r} must be a positive integer")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is not valid; valid choices: {OPTIMIZERS}")
        check_embed(self.embed)
        check_attn_backend(self.attn_backend)

    @property
    def mode(self) -> str | None:
        """The ``torch.compile`` mode these switches amount to (None: the default mode)."""
        if self.autotune:
            return "max-autotune" if self.cudagraphs else "max-autotune-no-cudagraphs"
        return "reduce-overhead" if self.cudagraphs else None

    def replace(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "mode": self.mode}

    def __str__(self) -> str:
        return (f"compiled ({self.mode or 'default'} mode), bf16, batch {self.batch_size}, "
                f"{self.optimizer} AdamW, {self.embed} embedding, "
                f"{self.attn_backend or 'default'} attention")


def seed_recipe(ladder: Ladder) -> Recipe:
    """R3's configuration: compiled, bf16 autocast, the big batch, everything else default."""
    return Recipe(batch_size=ladder.config.big_batch)


def fastest(ladder: Ladder) -> tuple[str, Recipe]:
    """``(rung name, Recipe)`` of the fastest configuration so far (R3's until a B rung wins)."""
    return ladder.fastest if ladder.fastest is not None else (SEED_TOP, seed_recipe(ladder))


def build_step(ladder: Ladder, recipe: Recipe) -> TrainStep:
    """A fresh model (the ladder's initial weights), its AdamW and the step ``recipe`` describes."""
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a perfladder.torch.beyond.Recipe, got {type(recipe).__name__}")
    return ladder.fresh_step(compiled=True, bf16=True, embed=recipe.embed,
                             attn_backend=recipe.attn_backend, optimizer=recipe.optimizer,
                             mode=recipe.mode)


def timed_steps(ladder: Ladder, batch_size: int) -> int:
    """Steps per timed window: the config's at the big batch, fewer at bigger batches so a
    window holds about as many tokens (never fewer than 2 steps)."""
    c = ladder.config
    if batch_size <= c.big_batch:
        return c.timed
    return max(2, round(c.timed * c.big_batch / batch_size))


# -- gates ----------------------------------------------------------------------------------
def gate_batches(ladder: Ladder, batch_size: int) -> list:
    """``GATE_STEPS`` fixed (X, Y) batches of ``batch_size``, the same for every configuration."""
    cache = ladder.beyond.setdefault("gate_batches", {})
    if batch_size not in cache:
        stream = batches(ladder.data, batch_size, ladder.device,
                         seed=ladder.config.seed + GATE_SEED_OFFSET)
        cache[batch_size] = [next(stream) for _ in range(GATE_STEPS)]
    return cache[batch_size]


def gate_losses(step, fixed) -> tuple[list[float], float]:
    """Losses of ``step`` over the batches ``fixed`` (read once at the end), and the seconds
    its first call took (the compile, when the configuration is new)."""
    losses = []
    t0 = time.perf_counter()
    for i, (X, Y) in enumerate(fixed):
        losses.append(step(X, Y))
        if i == 0:
            sync()
            first_s = time.perf_counter() - t0
    return torch.stack(losses).float().cpu().tolist(), first_s


def reference_losses(ladder: Ladder, batch_size: int) -> list[float]:
    """The seed recipe run eagerly (bf16 autocast, gather, default AdamW and attention) from
    the initial weights over ``gate_batches``: what every beyond configuration must reproduce."""
    cache = ladder.beyond.setdefault("reference_losses", {})
    if batch_size not in cache:
        step = ladder.fresh_step(compiled=False, bf16=True)
        cache[batch_size] = gate_losses(step, gate_batches(ladder, batch_size))[0]
        del step
        _free(ladder, graphs=False)      # a configuration's recorded graphs may still be in use
    return cache[batch_size]


def _max_abs_diff(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def loss_gate(ladder: Ladder, step, batch_size: int, atol: float = LOSS_ATOL) -> dict:
    """Run ``step`` ``GATE_STEPS`` times from the initial weights over the fixed gate batches and
    compare its losses with the eager seed recipe's (and, at the big batch, the compiled R3
    recipe's). Raises ``LossGateError`` past ``atol``; returns what it compared."""
    losses, first_s = gate_losses(step, gate_batches(ladder, batch_size))
    refs = {"seed recipe, eager": reference_losses(ladder, batch_size)}
    r3 = ladder.beyond.get("r3_losses")
    if batch_size == ladder.config.big_batch and r3 is not None:
        refs["R3 recipe, compiled"] = r3
    diffs = {k: _max_abs_diff(losses, v) for k, v in refs.items()}
    for k, d in diffs.items():
        if not d <= atol:                                   # NaN fails too
            raise LossGateError(
                f"losses over the first {GATE_STEPS} steps {[round(x, 5) for x in losses]} differ "
                f"from the {k}'s {[round(x, 5) for x in refs[k]]} by {d:.3g} > atol={atol}: "
                "not timing a configuration that trains a different model")
    return {"steps": GATE_STEPS, "batch_size": batch_size, "losses": losses, "references": refs,
            "max_abs_diff": diffs, "atol": atol, "first_call_s": first_s}


@contextlib.contextmanager
def true_fp32():
    """fp32 matmuls without TF32 for the block (restored after)."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def embed_gate(ladder: Ladder, X: torch.Tensor, atol: float = EMBED_ATOL,
               grad_rtol: float = EMBED_GRAD_RTOL) -> dict:
    """The one-hot embedding computes the gather's model: fp32 logits of two eager models with
    the same weights agree to ``atol`` (true fp32, no autocast, no TF32), and the gradients
    of the shared table agree to ``grad_rtol`` of their largest entry. ``MirrorError`` if not."""
    gather = ladder.make_model(embed="gather")
    onehot = ladder.make_model(embed="onehot")
    onehot.load_state_dict(gather.state_dict())
    out = {}
    with true_fp32(), torch.autocast(ladder.device_type, enabled=False):
        for name, m in (("gather", gather), ("onehot", onehot)):
            logits = m(X)                                                   # (B, T, V)
            logits.float().logsumexp(-1).mean().backward()
            out[name] = (logits.detach(), m.token_emb.weight.grad.detach())
    (lg, gg), (lo, go) = out["gather"], out["onehot"]
    diff = (lg - lo).abs().max().item()
    gdiff = (gg - go).abs().max().item() / max(gg.abs().max().item(), 1e-30)
    if lg.dtype != torch.float32 or not diff <= atol:
        raise MirrorError(f"one-hot embedding logits differ from the gather's: max |diff| "
                          f"{diff:.3g} > atol={atol} (dtype {lg.dtype})")
    if not gdiff <= grad_rtol:
        raise MirrorError(f"one-hot embedding's table gradient differs from the gather's: "
                          f"max |diff| / max |grad| = {gdiff:.3g} > {grad_rtol}")
    return {"logits_max_abs_diff": diff, "grad_max_rel_diff": gdiff, "atol": atol,
            "grad_rtol": grad_rtol, "batch_shape": list(X.shape)}


# -- what R3's profile says -------------------------------------------------------------------
def base_profile(ladder: Ladder) -> KernelBreakdown | None:
    """Profile the seed recipe once, before the first B rung; record its gate losses too.

    The breakdown is stored as R3's ``extra['kernels']`` (when R3 is in this ladder) and kept
    in ``ladder.beyond['base']`` for the rungs' diagnoses. A profiler failure is recorded
    (``ladder.beyond['base_error']``, the result's notes) and does not stop the ladder.
    """
    if "base" in ladder.beyond:
        return ladder.beyond["base"]
    ladder.beyond["base"] = None
    recipe = seed_recipe(ladder)

    def record_gate_losses(step):
        ladder.beyond["r3_losses"] = gate_losses(step, gate_batches(ladder, recipe.batch_size))[0]

    kb, error = _profile_recipe(ladder, recipe, "profile of the seed recipe before the B rungs",
                                before=record_gate_losses, steps=ladder.profile_steps,
                                warmup=2, top=500)
    if kb is None:                        # the diagnosis is lost, the ladder is not
        ladder.beyond["base_error"] = error
        return None
    ladder.beyond["base"] = kb
    try:
        r3 = ladder.result.rung(SEED_TOP)
        r3.extra["kernels"] = trimmed(kb).to_dict()
        r3.extra["kernels_recipe"] = recipe.to_dict()
    except KeyError:
        pass
    return kb


def _profile_recipe(ladder: Ladder, recipe: Recipe, what: str, before=None, **kw):
    """``(KernelBreakdown, None)`` of a fresh step of ``recipe`` (``kernel_breakdown(**kw)``),
    or ``(None, error)`` after a loud note ``"<what> failed: <error>"``: a profiler failure
    costs the diagnosis, not the ladder. ``before(step)`` runs on the step first."""
    step = None
    try:
        step = build_step(ladder, recipe)
        if before is not None:
            before(step)
        with _drop_kineto_trace_lines():
            return kernel_breakdown(step, ladder.stream(recipe.batch_size), **kw), None
    except Exception as e:
        msg = f"{type(e).__name__}: {e}"[:2000]
        ladder.result.notes.append(f"{what} failed: {msg}")
        print(f"perfladder: {ladder.result.notes[-1]}", file=sys.stderr, flush=True)
        return None, msg
    finally:
        del step
        _free(ladder)


def trimmed(kb: KernelBreakdown, top: int = 12) -> KernelBreakdown:
    """``kb`` with only its ``top`` kernels listed (the category sums keep every kernel)."""
    return dataclasses.replace(kb, top=kb.top[:top])


def _ms(kb: KernelBreakdown, us: float) -> str:
    return f"{us / kb.steps / 1000:.2f} ms/step"


def _time(kb: KernelBreakdown) -> str:
    return "kernel time" if kb.device == "gpu" else "operator time"


def _cat(kb: KernelBreakdown, *cats: str) -> str:
    us = sum(kb.category_us.get(c, 0.0) for c in cats)
    return f"{100 * us / kb.total_us:.1f}% of {_time(kb)} ({_ms(kb, us)})"


def _where(ladder: Ladder) -> str:
    what = "kernel" if ladder.on_gpu else "CPU-operator (smoke: shares of a CPU run)"
    return f"the seed recipe's {what} profile"


def diagnosis(ladder: Ladder, topic: str) -> str:
    """One line: the regime a rung attacks and what the seed recipe's profile said about it."""
    kb = ladder.beyond.get("base")
    regime, claim = DIAGNOSES[topic]
    if kb is None:
        said = "no profile (it failed; see the result's notes)"
    elif topic == "optimizer":
        said = f"AdamW took {_cat(kb, 'optimizer')}"
    elif topic == "launch":
        said = (f"{kb.num_events / kb.steps:.0f} kernel launches per step; kernels busy "
                f"{'?' if kb.busy is None else f'{100 * kb.busy:.0f}%'} of the profiled wall time")
    elif topic == "embedding":
        hits = [k for k in kb.top if SCATTER_KERNELS.search(k.name)]
        us = sum(k.total_us for k in hits)
        said = (f"{len(hits)} embedding-gradient kernel(s) took {100 * us / kb.total_us:.1f}% of "
                f"{_time(kb)} ({_ms(kb, us)})" if hits else
                "no kernel named after the embedding gradient (compiled code fuses it out of sight "
                "on CPU)")
    elif topic == "batch":
        said = (f"matmuls {_cat(kb, 'matmul')}; the optimizer's fixed cost "
                f"{_ms(kb, kb.category_us.get('optimizer', 0.0))}")
    elif topic == "attention":
        said = f"attention took {_cat(kb, 'attention')}"
    else:  # autotune
        said = f"elementwise and norm kernels took {_cat(kb, 'elementwise', 'reduction/norm')}"
    return f"diagnosis ({regime}): {_where(ladder)} -- {said}; {claim}"


DIAGNOSES = {
    "optimizer": ("overhead/bandwidth", "one pass over weights, gradients and both moments in a "
                  "few fused launches instead of a foreach kernel per operation"),
    "launch": ("overhead", "CUDA graphs replay the whole step's launches at once, so the gain is "
               "bounded by the time the GPU waits for the CPU"),
    "embedding": ("bandwidth/atomics", "the gather's gradient scatter-adds B*T rows into V=28 "
                  "rows; one_hot(X)^T @ dH is a plain matmul"),
    "batch": ("compute", "more rows per GEMM (M = B*T) and per-step fixed costs spread over "
              "more tokens; memory is the price"),
    "attention": ("compute", "the fused attention kernels tile T=128, Dh=64 differently: "
                  "measured, not assumed"),
    "autotune": ("bandwidth", "Triton GEMM templates can fuse bias, GELU and residual adds into "
                 "the GEMM epilogue and skip a round trip through memory"),
}


# -- running one rung -------------------------------------------------------------------------
def _rate(ladder: Ladder, name: str) -> float | None:
    try:
        return ladder.result.rung(name).tokens_per_s
    except KeyError:
        return None


SMOKE_POLICY = ("smoke config: the decision ignores the (meaningless) CPU numbers -- every added "
                "technique is kept, a choice between implementations (B2, B7) is not -- so a smoke "
                "run always exercises the same configurations, and both paths")
# Rungs that choose between implementations of something the recipe already does (the
# optimizer's kernel, the attention kernel) rather than add a technique.
ALTERNATIVES = ("B2", "B7")


def keeps(ladder: Ladder, name: str, rate: float, base: float | None) -> bool:
    """Is rung ``name``, measured at ``rate``, kept over the configuration at ``base`` (None:
    nothing measured)? Faster is kept. In the smoke config the numbers are not performance
    results, and a chain that followed their noise would compile a different set of
    configurations on every run: there every added switch is kept, and an alternative
    (``ALTERNATIVES``) is not."""
    if ladder.config.is_smoke:
        return name not in ALTERNATIVES
    return base is None or rate > base


def _record(ladder: Ladder, res: RungResult, recipe: Recipe, prev: str) -> RungResult:
    """Add ``res`` against ``prev``; keep ``recipe`` as the fastest if ``keeps`` says so."""
    base = _rate(ladder, prev)
    ladder.add(res, prev=prev if base is not None else None)
    if base is None:
        res.ratio_prev = None        # nothing measured to build on in this ladder
    kept = keeps(ladder, res.name, res.tokens_per_s, base)
    res.extra["kept"] = kept
    if ladder.config.is_smoke:
        why = SMOKE_POLICY
    elif base is None:
        why = "nothing measured before it"
    else:
        why = f"{res.tokens_per_s / base:.3f}x {prev}"
    if kept:
        ladder.fastest = (res.name, recipe)
        res.notes.append(f"kept ({why}); the next rungs build on {res.name}")
    else:
        res.notes.append(f"not kept ({why}); the next rung builds on {prev} again")
    return res


def _skip(ladder: Ladder, name: str, label: str, notes, extra=None) -> RungResult:
    """Add a 'skipped' entry: nothing measured, ``notes`` (a string or a list) say why."""
    notes = [notes] if isinstance(notes, str) else list(notes)
    return ladder.add(RungResult(name=name, label=label, tokens_per_s=None, kind="skipped",
                                 notes=notes, extra=dict(extra or {})))


def measure_recipe(ladder: Ladder, name: str, label: str, recipe: Recipe, *, topic: str,
                   notes=(), extra=None, check=None) -> RungResult:
    """Build ``recipe``'s step, gate it, time it, record it against the fastest so far.

    ``check(step, X)`` runs an extra, rung-specific gate before timing and returns a dict
    stored in ``extra``.
    """
    prev, _ = fastest(ladder)
    B = recipe.batch_size
    reference_losses(ladder, B)          # the eager reference first: its memory is gone before
    step = build_step(ladder, recipe)    # the configuration under test is built
    gate = loss_gate(ladder, step, B)
    X0 = gate_batches(ladder, B)[0][0]
    receipt = check_bf16(step.logits(X0).detach())
    more = {} if check is None else check(step, X0)
    timed = timed_steps(ladder, B)
    tput, peak = ladder.measure(step, B, timed=timed)
    del step
    ladder.throughputs[name] = tput
    diffs = ", ".join(f"{k} {d:.2g}" for k, d in gate["max_abs_diff"].items())
    all_notes = [diagnosis(ladder, topic), f"recipe: {recipe}", *notes,
                 f"gate: {GATE_STEPS} steps from the initial weights, losses within "
                 f"{LOSS_ATOL} of the references (max |diff|: {diffs}); receipt: logits {receipt}",
                 f"first call (compile, or a cache hit) {gate['first_call_s']:.1f} s"]
    if timed != ladder.config.timed:
        all_notes.append(f"{timed} steps per timed window (about the tokens of "
                         f"{ladder.config.timed} steps at batch {ladder.config.big_batch})")
    if not ladder.on_gpu:
        all_notes.append("bf16 via torch.autocast('cpu') (smoke: not a performance number)")
    res = ladder.rung_result(name, label, tput, batch_size=B, bf16=True, peak_mem=peak,
                             notes=all_notes,
                             extra={"builds_on": prev, "recipe": recipe.to_dict(),
                                    "loss_gate": gate, "logits_dtype": receipt, **more,
                                    **(extra or {})})
    return _record(ladder, res, recipe, prev)


def beyond_rung(name: str, label: str, change=None, not_on_cpu: str | None = None):
    """Decorator: a B rung ``fn(ladder, prev, base) -> RungResult``, run after the base profile;
    a run-time failure becomes a loud 'skipped' entry and the ladder goes on.

    ``not_on_cpu``: the technique does not exist on CPU; there the rung is a 'skipped' entry
    with this note (nothing built, nothing measured). ``change(base) -> Recipe``: the recipe
    it would measure, recorded with the skip.
    """
    def wrap(fn):
        def rung(ladder: Ladder) -> RungResult:
            if ladder.fastest is None:
                ladder.fastest = (SEED_TOP, seed_recipe(ladder))
            prev, base = fastest(ladder)
            if not_on_cpu is not None and not ladder.on_gpu:
                would = change(base) if change is not None else base
                return _skip(ladder, name, label, f"not applicable on CPU: {not_on_cpu}",
                             extra={"builds_on": prev, "recipe": would.to_dict()})
            try:
                base_profile(ladder)
                return fn(ladder, prev, base)
            except Exception as e:
                msg = f"{type(e).__name__}: {e}"
                note = (f"FAILED on {ladder.device_name}, nothing measured (would have built on "
                        f"{prev}): {msg}")[:3000]
                print(f"perfladder: {name} {note}", file=sys.stderr, flush=True)
                return _skip(ladder, name, label, note,
                             extra={"builds_on": prev, "recipe": base.to_dict(), "error": msg[:3000],
                                    "traceback": traceback.format_exc()[-4000:]})
            finally:
                _free(ladder)
        rung.__name__ = fn.__name__
        rung.__qualname__ = fn.__qualname__
        rung.__doc__ = fn.__doc__
        rung.label = label
        return rung
    return wrap


def _free(ladder: Ladder, graphs: bool = True) -> None:
    """On a GPU, hand a finished configuration's memory back before the next one is built:
    its recorded CUDA graphs and their memory pool (``graphs``; only between configurations,
    never while a cudagraph step is alive), then whatever the collector frees. On CPU there
    is no device memory to measure, and a full collection costs ~0.3 s."""
    if not ladder.on_gpu:
        return
    if graphs:
        try:
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees
        except ImportError:      # pragma: no cover - older torch
            reset_cudagraph_trees = None
        if reset_cudagraph_trees is not None:
            reset_cudagraph_trees()
            # Dynamo's cached code still points at the graphs just shut down; a later compile
            # of the same forward (the learning check) would replay them and fail with
            # "Running CUDAGraph after shutdown" (seen on the H200). Start compiles afresh.
            torch._dynamo.reset()
    ladder.reset_memory()


# -- B1 / B2: the optimizer ---------------------------------------------------------------------
@beyond_rung("B1", "+fused AdamW")
def b1_fused_adamw(ladder: Ladder, prev: str, base: Recipe) -> RungResult:
    """AdamW(fused=True): the whole update in one kernel per parameter group and dtype."""
    return measure_recipe(ladder, "B1", "+fused AdamW", base.replace(optimizer="fused"),
                          topic="optimizer")


@beyond_rung("B2", "compiled AdamW")
def b2_compiled_adamw(ladder: Ladder, prev: str, base: Recipe) -> RungResult:
    """The default AdamW with its step torch.compile-d, in place of whatever optimizer won so far."""
    return measure_recipe(ladder, "B2", "compiled AdamW", base.replace(optimizer="compiled"),
                          topic="optimizer",
                          notes=[f"the alternative to B1's fused kernel: replaces the "
                                 f"{base.optimizer} AdamW of {prev}; whichever is faster is kept"])


# -- B3: CUDA graphs --------------------------------------------------------------------------------
@beyond_rung("B3", "+CUDA graphs", change=lambda base: base.replace(cudagraphs=True),
             not_on_cpu="CUDA graphs exist only on a CUDA device, and mode='reduce-overhead' "
                        "on CPU would compile the default mode; nothing is measured under this "
                        "name (a GPU test in tests/test_torch_beyond.py runs it)")
def b3_cudagraphs(ladder: Ladder, prev: str, base: Recipe) -> RungResult:
    """torch.compile(mode='reduce-overhead'): the model's forward and backward as CUDA graphs."""
    return measure_recipe(ladder, "B3", "+CUDA graphs", base.replace(cudagraphs=True), topic="launch",
                          notes=["torch.compiler.cudagraph_mark_step_begin() opens every step; "
                                 "the optimizer step stays outside the graphs"])


# -- B4: scatter-free embedding ---------------------------------------------------------------------
@beyond_rung("B4", "+one-hot embedding")
def b4_onehot_embedding(ladder: Ladder, prev: str, base: Recipe) -> RungResult:
    """GPT(embed='onehot'): the embedding's gradient becomes a matmul instead of a scatter-add."""
    rows = ladder.config.batch_size

    def check(step, X):
        return {"embed_gate": embed_gate(ladder, X[:rows])}

    c = ladder.gpt_config
    return measure_recipe(ladder, "B4", "+one-hot embedding", base.replace(embed="onehot"),
                          topic="embedding", check=check,
                          notes=[f"cost of the one-hot product: 2*V*D = {2 * c.vocab_size * c.num_hiddens:,} "
                                 f"FLOPs/token forward (the model: {ladder.flops_per_token / 3:,.0f}); "
                                 "same parameter token_emb.weight, so checkpoints and parity are unchanged",
                                 f"gate: one-hot logits == gather logits in true fp32 (atol {EMBED_ATOL}), "
                                 f"table gradients within {EMBED_GRAD_RTOL} relative"])


# -- B5 / B6: the batch --------------------------------------------------------------------------------
def _batch_rung(ladder: Ladder, name: str, factor: int, base: Recipe) -> RungResult:
    B = ladder.config.big_batch * factor
    notes = [f"batch {base.batch_size} -> {B} (big_batch x{factor})"]
    try:
        prev_mem = ladder.result.rung(fastest(ladder)[0]).peak_mem_bytes
    except KeyError:
        prev_mem = None
    if prev_mem:
        notes.append(f"the configuration it builds on peaked at {prev_mem / 2**30:.2f} GiB")
    return measure_recipe(ladder, name, f"batch x{factor}", base.replace(batch_size=B),
                          topic="batch", notes=notes)


@beyond_rung("B5", "batch x2")
def b5_batch_x2(ladder: Ladder, prev: str, base: Recipe) -> RungResult:
    """The fastest configuration at twice the big batch (peak memory recorded)."""
    return _batch_rung(ladder, "B5", 2, base)


@beyond_rung("B6", "batch x4")
def b6_batch_x4(ladder: Ladder, prev: str, base: Recipe) -> RungResult:
    """The fastest configuration at four times the big batch (peak memory recorded)."""
    return _batch_rung(ladder, "B6", 4, base)


# -- B7: the attention kernel ---------------------------------------------------------------------------
def attention_backends(ladder: Ladder, batch_size: int, reps: int | None = None) -> dict:
    """Time causal SDPA forward + backward on the model's q/k/v shape, in bf16, for PyTorch's
    own choice ('default') and each of ``BACKENDS`` pinned. Returns ``{name: {...}}`` with
    ``ms`` (median of ``reps`` synced calls) or ``available: False`` and PyTorch's reason."""
    c = ladder.gpt_config
    B, H, T, Dh = batch_size, c.num_heads, ladder.config.num_steps, c.head_dim
    reps = reps or (20 if ladder.on_gpu else 5)
    gen = torch.Generator(device=ladder.device).manual_seed(ladder.config.seed)
    q, k, v = (torch.randn(B, H, T, Dh, device=ladder.device, dtype=torch.bfloat16,
                           generator=gen).requires_grad_() for _ in range(3))   # (B, H, T, Dh)
    dy = torch.randn(B, H, T, Dh, device=ladder.device, dtype=torch.bfloat16, generator=gen)
    scale = 1.0 / Dh ** 0.5

    def call():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        torch.autograd.grad(y, (q, k, v), dy)

    out = {}
    picks = default_choice(q, k, v, scale)
    for name in ("default", *BACKENDS):
        ctx = contextlib.nullcontext() if name == "default" else sdpa_kernel(ATTN_BACKENDS[name])
        try:
            with ctx, warnings.catch_warnings():
                warnings.simplefilter("ignore")            # the refusal's reasons come as warnings
                call()
                sync()
                times = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    call()
                    sync()
                    times.append(time.perf_counter() - t0)
            times.sort()
            out[name] = {"available": True, "ms": 1e3 * times[len(times) // 2]}
        except RuntimeError as e:
            out[name] = {"available": False, "error": str(e).strip().splitlines()[0][:300]}
    out["default"]["picks"] = picks
    del q, k, v, dy
    return out


def default_choice(q, k, v, scale) -> str | None:
    """The backend PyTorch's own priority picks for these inputs (causal), by name; None when
    this torch cannot say (``torch._fused_sdp_choice`` is internal)."""
    by_value = {int(b.value): n for n, b in ATTN_BACKENDS.items() if b is not None}
    try:
        return by_value.get(int(torch._fused_sdp_choice(q, k, v, is_causal=True, scale=scale)))
    except (AttributeError, RuntimeError, TypeError):
        return None


def pick_backend(timings: dict) -> str:
    """The fastest available pinned backend in ``attention_backends``' output."""
    ok = {n: t["ms"] for n, t in timings.items() if n in BACKENDS and t.get("available")}
    if not ok:
        raise RuntimeError(f"no attention backend could run: {timings}")
    return min(ok, key=ok.get)


@beyond_rung("B7", "attention backend")
def b7_attention_backend(ladder: Ladder, prev: str, base: Recipe) -> RungResult:
    """Time every SDPA backend on the fastest configuration's shapes; pin the fastest; measure.
    When PyTorch's own choice already is the fastest, there is nothing to change: the rung is
    recorded as 'skipped' with the timings (no second measurement of the same kernels)."""
    timings = attention_backends(ladder, base.batch_size)
    best = pick_backend(timings)
    picks = timings["default"].get("picks")
    ran = [n for n in BACKENDS if timings[n]["available"]]
    refused = [n for n in BACKENDS if not timings[n]["available"]]
    table = "; ".join(f"{n} {t['ms']:.3f} ms" if t["available"] else f"{n} n/a"
                      for n, t in timings.items())
    notes = [f"attention forward+backward alone at batch {base.batch_size} (bf16, causal, "
             f"median of synced calls): {table}; PyTorch's default picks "
             f"{picks or 'an unreported backend'}; the fastest pinned: {best}"]
    if not ladder.on_gpu:
        notes.append(f"on CPU {', '.join(ran)} ran ('flash' is PyTorch's CPU flash-attention "
                     f"kernel); {', '.join(refused) or 'none'} refused: "
                     "'efficient' and 'cudnn' are CUDA kernels")
    elif refused:
        notes.append("refused here: " + "; ".join(f"{n} ({timings[n]['error']})" for n in refused))
    extra = {"attention_ms": timings, "attention_backend": best, "default_picks": picks}
    recipe = base.replace(attn_backend=best)
    if picks == best and base.attn_backend in (None, best):
        return _skip(ladder, "B7", f"attention: {best}",
                     [f"not measured: PyTorch's default already runs the fastest kernel ({best}), "
                      f"so pinning it would time {prev}'s kernels again", *notes],
                     extra={"builds_on": prev, "recipe": recipe.to_dict(), **extra})
    return measure_recipe(ladder, "B7", f"attention: {best}", recipe, topic="attention",
                          notes=notes, extra=extra)


# -- B8: max-autotune --------------------------------------------------------------------------------------
@beyond_rung("B8", "+max-autotune", change=lambda base: base.replace(autotune=True),
             not_on_cpu="the Triton GEMM templates it tunes are GPU kernels (max-autotune on CPU "
                        "tunes C++ GEMM templates instead, a different technique); nothing is "
                        "measured under this name (a GPU test in tests/test_torch_beyond.py runs it)")
def b8_max_autotune(ladder: Ladder, prev: str, base: Recipe) -> RungResult:
    """torch.compile(mode='max-autotune-no-cudagraphs') (or 'max-autotune' on top of CUDA
    graphs): benchmark Triton GEMM templates against cuBLAS at compile time, fuse epilogues."""
    recipe = base.replace(autotune=True)
    return measure_recipe(ladder, "B8", "+max-autotune", recipe, topic="autotune",
                          notes=[f"mode={recipe.mode!r}: compile time includes benchmarking "
                                 "every GEMM shape's candidate kernels"])


BEYOND = {"B1": b1_fused_adamw, "B2": b2_compiled_adamw, "B3": b3_cudagraphs,
          "B4": b4_onehot_embedding, "B5": b5_batch_x2, "B6": b6_batch_x4,
          "B7": b7_attention_backend, "B8": b8_max_autotune}
OPTIONAL = ("B8",)          # in RUNGS, but run only when named (or beyond_autotune=True)


# -- kernel breakdown of the fastest configuration -------------------------------------------
def kernel_report(ladder: Ladder, steps: int | None = None, warmup: int = 3,
                  top: int = 12) -> KernelBreakdown | None:
    """Profile the fastest configuration (a fresh step, outside any timed window); its kernel
    breakdown, stored as ``extra['kernels']`` (``KernelBreakdown.to_dict()``) of the fastest rung.

    A profiler failure does not end the ladder: it is recorded in that rung's
    ``extra['kernels_error']`` and in the result's notes, and ``None`` is returned.
    """
    name, recipe = fastest(ladder)
    steps = ladder.profile_steps if steps is None else steps
    try:
        rung = ladder.result.rung(name)
    except KeyError:
        rung = None
    kb, error = _profile_recipe(ladder, recipe, f"kernel breakdown of {name} ({recipe})",
                                steps=steps, warmup=warmup, top=top)
    if kb is None:
        if rung is not None:
            rung.extra["kernels_error"] = error
        return None
    if rung is not None:
        rung.extra["kernels"] = kb.to_dict()
        rung.extra["kernels_recipe"] = recipe.to_dict()
    return kb


# -- what is not measured, and why --------------------------------------------------------------
def not_run(ladder: Ladder, kb: KernelBreakdown | None = None) -> list[str]:
    """The candidates this ladder does not measure, each with its reason, sized with this
    ladder's own numbers: the fastest recipe's batch and, when given, ``kb``'s shares."""
    _, recipe = fastest(ladder)
    g, T, B = ladder.gpt_config, ladder.config.num_steps, recipe.batch_size
    rows = B * T
    logits_mib = rows * g.vocab_size * 4 / 2**20
    stream_mib = rows * g.num_hiddens * 4 / 2**20
    if kb is None:
        bound, traffic = "", ""
    else:
        mm = 100 * kb.share("matmul")
        ew = 100 * (kb.share("elementwise") + kb.share("reduction/norm"))
        bound = (f"The kernel breakdown puts the matmuls at {mm:.0f}% of {_time(kb)}, so even "
                 f"twice the speed on every GEMM would save at most {mm / 2:.0f}%. ")
        traffic = f", in a step where elementwise and norm kernels already take {ew:.0f}% of {_time(kb)}"
    return [
        f"**Fusing the loss into the output projection** (chunked cross-entropy that never "
        f"materialises the logits). It pays when the logits are large. Here V = {g.vocab_size}: "
        f"the fp32 logits of a batch of {B} are {rows:,} x {g.vocab_size} x 4 B = "
        f"{logits_mib:.1f} MiB, less than a single fp32 tensor of the residual stream "
        f"({stream_mib:.1f} MiB). There is nothing to save.",
        f"**FP8 matmuls** (Hopper's FP8 tensor cores, twice the bf16 peak). {bound}"
        f"Per-tensor scaling adds an amax reduction and a cast over every activation it "
        f"quantises: more memory traffic{traffic}. And three of the four GEMMs per "
        f"block have K = {g.num_hiddens}, short enough that FP8 kernels run far from their "
        f"peak. Not attempted: torchao is not available offline, and a hand-written "
        f"`torch._scaled_mm` FFN (with its own backward) could not be tested against the bf16 "
        f"reference here, since FP8 matmuls need an sm_89+ GPU and this project's tests run "
        f"on CPU.",
        "**B8, `max-autotune`** (Triton GEMM templates with fused epilogues). Defined and "
        "tested, but not in the default run: its compile benchmarks candidate kernels for "
        "every GEMM shape and takes minutes. Run it with `run_ladder(cfg, beyond_autotune=True)` "
        "or `perfladder run torch --rungs ...,B8`.",
        "**Pure bf16 weights and optimizer state.** It would halve the optimizer's traffic, "
        "but it changes what is trained (no fp32 master weights), so it is not the same model.",
    ]
