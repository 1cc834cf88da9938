"""Rungs past the seed chapter: ``B1``, ``B2``, ... continue the JAX waterfall from R3.

At R3 (bf16 threaded, the big batch) the H200 showed what the seed's 4090 did not: the bf16
step *slower* than the fp32 control at the same batch, and erratic from step to step. B1
and B2 go after the cause, the embedding's gradient: a scatter-add of every one of the
B*T token rows into a table of V = 28 rows, i.e. tens of thousands of atomic adds landing on
a few thousand addresses. The later rungs are the remaining levers.

    B1  embedding gradient in fp32 (look up in the fp32 table, cast after)
    B2  scatter-free embedding: one_hot(X) @ table, whose gradient is a matmul
    B3  split/merge ``jax.jit`` step with donated state, instead of ``nnx.jit``
    B4  cuDNN fused attention (GPU only)
    B5  batch x2
    B6  batch x4

How they chain. Each rung takes the fastest configuration measured so far (a ``Recipe``;
R3's until a B rung beats it), changes one thing, gates the change, measures it, and
records it with ``prev=`` the rung it builds on. A rung that wins is what the next one
builds on; a rung that loses stays in the waterfall as a bar below its predecessor and the
next rung builds on the previous winner. A technique that fails at run time (cuDNN
refusing a shape, memory running out) is recorded as ``kind='skipped'`` with the error in
its notes, and the ladder goes on.

``kernel_report(ladder)`` profiles the fastest configuration outside any timed window and
stores its kernel breakdown in that rung's ``extra['kernels']``.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import re
import statistics
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp

from ..kernels import KernelBreakdown
from ..results import RungResult
from .kernels import compiled_hlo_text, kernel_breakdown
from .ladder import Ladder, first_batch
from .steps import (PARITY_TOL, _compare, _two_forwards_jit, assert_fp32_masters, make_split_step,
                    matmul_dtypes, planned_temp_bytes, receipt, scatter_add_dtypes, traced_flops)

SEED_TOP = "R3"            # the seed rung the B rungs continue from
LOOKUP_TOL = 1e-6          # one-hot rows vs gathered rows: exact up to the matmul's rounding
SPLIT_LOSS_TOL = 5e-3      # nnx.jit vs split step, loss after two identical steps (relative)


# -- what a rung measures -------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    """One training configuration of the bf16 model (fp32 masters, fp32 loss)."""
    batch_size: int
    embed: str = "gather"           # GPT(embed=...)
    embed_fp32: bool = False        # GPT(embed_fp32=...)
    attn_impl: str | None = None    # GPT(attn_impl=...)
    split: bool = False             # split/merge jax.jit step (True) or nnx.jit (False)

    def model_kw(self) -> dict:
        return dict(embed=self.embed, embed_fp32=self.embed_fp32, attn_impl=self.attn_impl)

    def replace(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        lookup = "fp32" if self.embed_fp32 else "bf16"
        return (f"bf16, batch {self.batch_size}, embedding {self.embed} ({lookup} lookup), "
                f"{self.attn_impl or 'xla'} attention, "
                f"{'split/merge jax.jit' if self.split else 'nnx.jit'} step")


def seed_recipe(ladder: Ladder) -> Recipe:
    """R3's configuration: bf16 threaded, the big batch, gather embedding, nnx.jit."""
    return Recipe(batch_size=ladder.config.big_batch)


def fastest(ladder: Ladder) -> tuple[str, Recipe]:
    """``(rung name, Recipe)`` of the fastest configuration so far (R3's until a B rung wins)."""
    return ladder.fastest if ladder.fastest is not None else (SEED_TOP, seed_recipe(ladder))


class Runner:
    """A recipe made concrete: a fresh model (the ladder's init), its AdamW, and its step.

    ``step(X, Y) -> loss``. With ``recipe.split`` the model's arrays are donated on the first
    call: use ``commit()`` before looking at ``model`` / ``optimizer`` again.
    """

    def __init__(self, ladder: Ladder, recipe: Recipe):
        if not isinstance(recipe, Recipe):
            raise TypeError(f"recipe must be a perfladder.jax.beyond.Recipe, got {type(recipe).__name__}")
        self.recipe = recipe
        self.model, self.optimizer = ladder.build(jnp.bfloat16, **recipe.model_kw())
        if recipe.split:
            self._split = make_split_step(self.model, self.optimizer)
            self.step, self.jitted = self._split, self._split
        else:
            self._split, shared = None, ladder.step
            self.step = lambda X, Y: shared(self.model, self.optimizer, X, Y)
            self.jitted = shared

    def lower_args(self, X, Y) -> tuple:
        """Arguments of ``jitted.lower(...)`` for this batch."""
        return (X, Y) if self._split is not None else (self.model, self.optimizer, X, Y)

    def lower(self, X, Y):
        return self.jitted.lower(*self.lower_args(X, Y))

    def commit(self):
        if self._split is not None:
            self._split.commit()
        return self.model, self.optimizer


# -- evidence helpers (also used by benchmarks/jax_bf16_anomaly.py) --------------------------
def per_step_times(step, stream, n: int, sync=jax.block_until_ready) -> list[float]:
    """Seconds of each of ``n`` steps, each closed by a device sync (batch draw included).

    Unlike the ladder's windows, this shows how steady the steps are: the anomaly's
    signature was steps that wander, not only a slow median.
    """
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        X, Y = next(stream)
        sync(step(X, Y))
        times.append(time.perf_counter() - t0)
    return times


def step_stats(times: list[float]) -> dict:
    """median / min / max / p10 / p90 / mean / stdev in ms, and (max - min) / median."""
    ms = sorted(1e3 * t for t in times)
    if not ms:
        raise ValueError("step_stats needs at least one time")
    q = lambda p: ms[min(len(ms) - 1, int(round(p * (len(ms) - 1))))]  # noqa: E731
    med = statistics.median(ms)
    return {"median_ms": med, "min_ms": ms[0], "max_ms": ms[-1], "p10_ms": q(0.10),
            "p90_ms": q(0.90), "mean_ms": statistics.fmean(ms),
            "stdev_ms": statistics.stdev(ms) if len(ms) > 1 else 0.0,
            "spread": (ms[-1] - ms[0]) / med if med > 0 else 0.0, "n": len(ms)}


def host_overhead(step, stream, n: int) -> dict:
    """Host time per call vs device time per step.

    After a sync (device idle), ``n`` calls are issued without waiting: the time until the
    last call returns is what Python spends per step (graph traversal, flattening, argument
    handling, dispatch); then we wait for the device. If the first number is well under the
    second, the host runs ahead and its cost is hidden; if it is close, the host sets the pace.
    """
    jax.block_until_ready(step(*next(stream)))
    t0 = time.perf_counter()
    out = None
    for _ in range(n):
        out = step(*next(stream))
    issued = time.perf_counter() - t0
    jax.block_until_ready(out)
    done = time.perf_counter() - t0
    synced = step_stats(per_step_times(step, stream, n))
    return {"n": n, "dispatch_ms_per_step": 1e3 * issued / n,
            "unsynced_ms_per_step": 1e3 * done / n, "synced_median_ms": synced["median_ms"]}


# `%name = bf16[28,512]{1,0} scatter(bf16[28,512]{1,0} %a, s32[65536,1]{1,0} %b, ...), ...`
_SCATTER = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<out>\(?[\w\[\],{}:\s]*?\)?)\s+"
                      r"scatter\((?P<args>[^)]*)\)")
_TYPE = re.compile(r"\b(pred|[sfu]\d+|bf16|f8\w*)\[([\d,]*)\]")


def scatters_in_hlo(text: str, table_shape: tuple[int, int]) -> list[dict]:
    """Every ``scatter`` instruction of an HLO module text, with element types and shapes.

    Fused computations are part of ``as_text()``, so scatters inside fusions are listed too.
    ``embedding_grad`` marks the one whose result has the embedding table's shape [V, D].
    """
    out = []
    for line in text.splitlines():
        m = _SCATTER.search(line)
        if not m:
            continue
        results = _TYPE.findall(m.group("out"))
        operands = _TYPE.findall(m.group("args"))
        shapes = [[int(d) for d in dims.split(",") if d] for _, dims in results]
        out.append({
            "name": m.group("name"),
            "result_types": [f"{t}[{d}]" for t, d in results],
            "operand_types": [f"{t}[{d}]" for t, d in operands],
            "element_types": sorted({t for t, _ in results + operands if not t.startswith(("s", "u"))}),
            "embedding_grad": any(tuple(s) == tuple(table_shape) for s in shapes),
            "line": line.strip()[:400],
        })
    return out


def embedding_scatters(text: str, table_shape) -> dict:
    """How many scatters into the [V, D] table the compiled program holds, and their types."""
    found = [s for s in scatters_in_hlo(text, table_shape) if s["embedding_grad"]]
    return {"count": len(found), "types": sorted({t for s in found for t in s["element_types"]})}


# -- one trial ------------------------------------------------------------------------------
def _receipts(runner: Runner, X) -> dict:
    """bf16 for real: first activation bf16, every matmul bf16 but an fp32 one-hot lookup."""
    got, dots = receipt(runner.model, X), matmul_dtypes(runner.model, X)
    r = runner.recipe
    fp32_lookups = 1 if (r.embed == "onehot" and r.embed_fp32) else 0
    if (got != "bfloat16" or set(dots) - {"bfloat16", "float32"} or not dots.get("bfloat16")
            or dots.get("float32", 0) != fp32_lookups):
        raise AssertionError(f"{r} is not computing in bf16: first activation {got}, matmul "
                             f"operands {dots} (expected bf16, plus {fp32_lookups} fp32 lookup)")
    return {"receipt": got, "matmul_dtypes": dots}


@dataclass
class Trial:
    """What ``_measure`` found; ``extra`` goes into the RungResult."""
    t: object
    model: object
    temp: int | None
    extra: dict


def _measure(ladder: Ladder, recipe: Recipe, *, gate: Callable | None = None,
             hlo_check: Callable | None = None, after: Callable | None = None,
             per_step: bool = False) -> Trial:
    """Gate, compile, time ``recipe``; the compiler's plan and the scatter evidence with it.

    ``gate(runner, X, Y) -> dict`` runs before anything is timed (it may step the runner);
    ``hlo_check(text, extra) -> dict`` inspects the compiled program before timing;
    ``after(runner, stream) -> dict`` runs after timing, before the state is committed.
    """
    runner = Runner(ladder, recipe)
    stream = ladder.stream(recipe.batch_size)
    X, Y = first_batch(stream)
    table = tuple(runner.model.token_emb.embedding.shape)
    extra = {"recipe": recipe.to_dict(), **_receipts(runner, X),
             "jaxpr_embedding_scatter_add": scatter_add_dtypes(runner.model, X, Y)}
    if gate is not None:
        extra.update(gate(runner, X, Y))
    compiled = runner.lower(X, Y).compile()         # the jit call below loads it from the cache
    text = compiled.as_text()
    extra["hlo_embedding_scatter"] = embedding_scatters(text, table)
    if hlo_check is not None:
        extra.update(hlo_check(text, extra))
    flops, temp = traced_flops(runner.model, X, Y), planned_temp_bytes(compiled)
    del compiled, text
    t = ladder.time(runner.step, stream)
    if per_step:
        extra["per_step"] = step_stats(per_step_times(runner.step, stream, ladder.config.timed))
    if after is not None:
        extra.update(after(runner, stream))
    model, opt = runner.commit()
    assert_fp32_masters(model, opt)
    extra.update(traced_flops_per_step=flops, planned_temp_bytes=temp)
    if flops:
        extra["traced_tflops"] = flops / t.step_time_s / 1e12
    return Trial(t=t, model=model, temp=temp, extra=extra)


def _rate(ladder: Ladder, name: str) -> float | None:
    try:
        return ladder.result.rung(name).tokens_per_s
    except KeyError:
        return None


def _record(ladder: Ladder, name: str, label: str, trial: Trial, recipe: Recipe, prev: str,
            notes: list[str]) -> RungResult:
    """Record the trial against ``prev``; keep the recipe if it beat ``prev``."""
    base = _rate(ladder, prev)
    extra = {**trial.extra, "builds_on": prev}
    temp_prev = ladder.plans.get(prev)
    if trial.temp and temp_prev:
        extra.update({f"temp_bytes_{prev}": temp_prev, "temp_ratio_vs_prev": trial.temp / temp_prev})
    r = ladder.record(name, label, trial.t, model=trial.model, dtype=jnp.bfloat16, mem=trial.temp,
                      notes=notes, extra=extra, prev=prev if base is not None else None)
    ladder.plans[name] = trial.temp
    kept = base is None or r.tokens_per_s > base
    r.extra["kept"] = kept
    if kept:
        ladder.fastest = (name, recipe)
        r.notes.append(f"kept: {'faster than ' + prev if base else 'nothing measured before it'}; "
                       f"the next rungs build on {name} ({recipe})")
    else:
        r.notes.append(f"not kept: {r.tokens_per_s / base:.2f}x {prev}, so the next rung builds "
                       f"on {prev} again")
    return r


def beyond_rung(name: str, label):
    """Decorator: run ``fn(ladder, prev, base_recipe)``; a run-time failure becomes a loud skip."""
    def wrap(fn):
        @functools.wraps(fn)
        def rung(ladder: Ladder) -> RungResult:
            prev, base = fastest(ladder)
            text = label(ladder) if callable(label) else label
            try:
                return fn(ladder, prev, base, name, text)
            except Exception as e:   # the ladder goes on; the skip says why, loudly
                msg = f"{type(e).__name__}: {e}"
                return ladder.skip(name, text, f"FAILED at run time on {ladder.device}, nothing "
                                   f"measured (would have built on {prev}): {msg}"[:3000],
                                   extra={"builds_on": prev, "base_recipe": base.to_dict(),
                                          "error": msg[:3000],
                                          "traceback": traceback.format_exc()[-4000:]})
            finally:
                gc.collect()       # drop this rung's models before the next one builds its own
        return rung
    return wrap


def _ms(stats: dict) -> str:
    return (f"median {stats['median_ms']:.1f} ms, p10-p90 {stats['p10_ms']:.1f}-{stats['p90_ms']:.1f} ms, "
            f"min-max {stats['min_ms']:.1f}-{stats['max_ms']:.1f} ms")


# -- B1 -------------------------------------------------------------------------------------
def _baseline_evidence(ladder: Ladder, recipe: Recipe, prev: str) -> dict:
    """The configuration B1 starts from, re-measured step by step, and its scatter dtypes."""
    runner = Runner(ladder, recipe)
    stream = ladder.stream(recipe.batch_size)
    X, Y = first_batch(stream)
    table = tuple(runner.model.token_emb.embedding.shape)
    asked = scatter_add_dtypes(runner.model, X, Y)
    try:                                  # R3 recorded its compiled program's scatters
        scat = ladder.result.rung(prev).extra["hlo_embedding_scatter"]
    except KeyError:
        scat = embedding_scatters(compiled_hlo_text(runner.jitted, *runner.lower_args(X, Y)), table)
    for _ in range(3):                                  # compiled already: a cache hit at most
        out = runner.step(*next(stream))
    jax.block_until_ready(out)
    stats = step_stats(per_step_times(runner.step, stream, ladder.config.timed))
    runner.commit()
    return {"jaxpr_embedding_scatter_add": asked, "hlo_embedding_scatter": scat, "per_step": stats}


@beyond_rung("B1", "+fp32 embedding grad")
def b1_embed_fp32(ladder: Ladder, prev: str, base: Recipe, name: str, label: str) -> RungResult:
    """The anomaly's first fix: look up in the fp32 table, so the gradient's scatter-add is f32."""
    cand = base.replace(embed_fp32=True)
    before = _baseline_evidence(ladder, base, prev)
    trial = _measure(ladder, cand, per_step=True)
    trial.extra["before"] = before
    B, T = cand.batch_size, ladder.config.num_steps
    V = ladder.gpt_config.vocab_size
    anomaly = ""
    r3, r3c = _rate(ladder, "R3"), _rate(ladder, "R3c")
    if r3 and r3c:
        anomaly = f"R3 (bf16) ran at {r3 / r3c:.2f}x the fp32 control R3c at this batch; "
    notes = [
        f"regime: the embedding gradient, a scatter-add of B*T = {B * T:,} rows into the {V}-row "
        f"table, which the bf16 model asks for in bf16 (jaxpr {before['jaxpr_embedding_scatter_add']}, "
        f"compiled HLO types {before['hlo_embedding_scatter']['types']}); on a GPU a bf16 atomic "
        "add under this much contention is a compare-and-swap loop that retries (openxla/xla#26371)",
        f"evidence: {anomaly}{prev}'s configuration re-measured step by step (synced): "
        f"{_ms(before['per_step'])}",
        f"fix: gather from the fp32 table and cast the rows after, so the scatter-add is f32 "
        f"(jaxpr {trial.extra['jaxpr_embedding_scatter_add']}, HLO types "
        f"{trial.extra['hlo_embedding_scatter']['types']}); step by step now {_ms(trial.extra['per_step'])}",
    ]
    if not ladder.gpu:
        notes.append("CPU: XLA:CPU computes a bf16 scatter in f32 anyway (the HLO types say so), so "
                     "there is no anomaly to fix here; the rung exercises the code path")
    return _record(ladder, name, label, trial, cand, prev, notes)


# -- B2 -------------------------------------------------------------------------------------
def _onehot_gate(runner: Runner, X, Y) -> dict:
    """The one-hot lookup must return exactly the rows a gather returns."""
    model = runner.model
    lookup = jnp.float32 if model.embed_fp32 else model.dtype
    want = jnp.take(model.token_emb.embedding[...].astype(lookup), X, axis=0).astype(model.dtype)
    got = model.embed(X)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"one-hot lookup gave {got.shape} {got.dtype}, gather {want.shape} {want.dtype}")
    g, w = got.astype(jnp.float32), want.astype(jnp.float32)
    rel = float(jnp.max(jnp.abs(g - w)) / jnp.maximum(jnp.max(jnp.abs(w)), 1e-30))
    if not rel <= LOOKUP_TOL:
        raise AssertionError(f"one-hot lookup != gathered rows: max|diff| / max|rows| = {rel:.3g} "
                             f"> allowed {LOOKUP_TOL:g}")
    return {"lookup_rel_diff": rel}


@beyond_rung("B2", "+one-hot embedding")
def b2_onehot(ladder: Ladder, prev: str, base: Recipe, name: str, label: str) -> RungResult:
    """Remove the scatter: the embedding as ``one_hot(X) @ table``, whose gradient is a matmul."""
    cand = base.replace(embed="onehot")
    def no_scatter(text, extra):
        if extra["hlo_embedding_scatter"]["count"]:
            raise AssertionError(f"the one-hot model still scatters into the table: "
                                 f"{extra['hlo_embedding_scatter']}")
        return {}

    trial = _measure(ladder, cand, gate=_onehot_gate, hlo_check=no_scatter, per_step=True)
    before = {}
    try:
        before = ladder.result.rung(prev).extra.get("hlo_embedding_scatter", {})
    except KeyError:   # prev not measured in this ladder
        pass
    V, D = ladder.gpt_config.vocab_size, ladder.gpt_config.num_hiddens
    after = trial.extra["hlo_embedding_scatter"]
    notes = [
        "regime: what is left of the embedding scatter -- atomic adds onto a few thousand "
        "addresses, contended whatever the dtype; on jaxlib 0.10.2-0.11.x even the f32 one may be "
        "a compare-and-swap loop (LLVM NVPTX change: jax-ml/jax#38806, openxla/xla#46225)",
        f"fix: one_hot(X) (B, T, {V}) @ table ({V}, {D}); the gradient is one_hot^T @ dH, a matmul "
        f"with no atomics; {4 * V * D:,} extra FLOPs per token against "
        f"{trial.model.flops_per_token(ladder.config.num_steps) / 1e6:.1f}M",
        f"evidence: embedding scatters in the compiled step {before.get('count', '?')} "
        f"({before.get('types', '?')}) -> {after['count']}; the one-hot rows equal the gathered ones "
        f"(max rel diff {trial.extra['lookup_rel_diff']:.1g}); step by step {_ms(trial.extra['per_step'])}",
    ]
    return _record(ladder, name, label, trial, cand, prev, notes)


# -- B3 -------------------------------------------------------------------------------------
@beyond_rung("B3", "+split jit, donated")
def b3_split_step(ladder: Ladder, prev: str, base: Recipe, name: str, label: str) -> RungResult:
    """``nnx.split`` once, ``jax.jit`` a pure step with the state donated, ``nnx.merge`` inside."""
    cand = base.replace(split=True)
    twin = Runner(ladder, base.replace(split=False))     # the nnx.jit step, same init
    n = max(3, ladder.config.timed // 4)

    def gate(runner, X, Y):
        a = [twin.step(X, Y) for _ in range(2)]
        b = [runner.step(X, Y) for _ in range(2)]
        a, b = float(a[-1]), float(b[-1])
        rel = abs(a - b) / max(abs(a), 1e-30)
        if not rel <= SPLIT_LOSS_TOL:
            raise AssertionError(f"split/merge step and nnx.jit step disagree after two identical "
                                 f"steps: loss {b:.6g} vs {a:.6g} (rel {rel:.2g} > {SPLIT_LOSS_TOL:g})")
        return {"gate_loss_rel_diff": rel}

    def after(runner, stream):
        return {"host_overhead": {"nnx.jit": host_overhead(twin.step, stream, n),
                                  "split": host_overhead(runner.step, stream, n)}}

    trial = _measure(ladder, cand, gate=gate, after=after)
    twin.commit()
    h = trial.extra["host_overhead"]
    step_ms = 1e3 * trial.t.step_time_s
    issue = h["nnx.jit"]["dispatch_ms_per_step"]
    verdict = ("issuing nnx.jit steps takes as long as the device needs for them: the host sets "
               "the pace" if issue >= 0.8 * step_ms else
               "issuing stays under the device step, so async dispatch hides most of it")
    notes = [
        "regime: host work per call -- nnx.jit walks the model and optimizer graph in Python and "
        "flattens every Variable on each call, and without donation each step allocates fresh "
        "buffers for the parameters and both Adam moments",
        f"evidence: time to issue one step {issue:.2f} ms (nnx.jit) vs "
        f"{h['split']['dispatch_ms_per_step']:.2f} ms (split) against a device step of {step_ms:.1f} ms; "
        + verdict,
        f"gate: both steps from the same init give the same loss after two steps "
        f"(rel diff {trial.extra['gate_loss_rel_diff']:.1g})",
    ]
    return _record(ladder, name, label, trial, cand, prev, notes)


# -- B4 -------------------------------------------------------------------------------------
@beyond_rung("B4", "+cuDNN attention")
def b4_cudnn(ladder: Ladder, prev: str, base: Recipe, name: str, label: str) -> RungResult:
    """cuDNN's fused attention kernel in place of XLA's (scores, mask, softmax in HBM)."""
    if not ladder.gpu:
        return ladder.skip(name, label, "not applicable on CPU: cuDNN fused attention "
                           "(jax.nn.dot_product_attention(implementation='cudnn')) needs a CUDA GPU; "
                           f"on a GPU this rung builds on {prev}",
                           extra={"builds_on": prev, "recipe": base.replace(attn_impl="cudnn").to_dict()})
    cand = base.replace(attn_impl="cudnn")

    def gate(runner, X, Y):
        reference = ladder.make_model(jnp.bfloat16, **base.model_kw())     # same init, XLA attention
        got, want = _two_forwards_jit(runner.model, reference, X)
        return {"parity_rel_diff": _compare(got, want, PARITY_TOL["bfloat16"], "cuDNN vs XLA attention")}

    def hlo_check(text, extra):
        calls = text.count("__cudnn$fmha")     # forward and backward custom calls
        if not calls:
            raise AssertionError("no cuDNN attention call (__cudnn$fmha...) in the compiled step: "
                                 "it did not run cuDNN attention")
        return {"cudnn_attention_calls": calls}

    trial = _measure(ladder, cand, gate=gate, hlo_check=hlo_check)
    notes = [
        "regime: attention -- the XLA path writes the (B, H, T, T) scores, the causal mask and the "
        "softmax to memory and reads them back (and again in the backward pass); cuDNN's fused "
        "kernel keeps them on chip",
        f"gate: logits == XLA attention's (max|diff| / max|logits| {trial.extra['parity_rel_diff']:.2g}); "
        f"{trial.extra['cudnn_attention_calls']} cuDNN attention calls in the compiled step",
    ]
    return _record(ladder, name, label, trial, cand, prev, notes)


# -- B5 / B6 --------------------------------------------------------------------------------
def _batch_rung(ladder: Ladder, prev: str, base: Recipe, name: str, label: str, k: int) -> RungResult:
    cand = base.replace(batch_size=k * ladder.config.big_batch)
    trial = _measure(ladder, cand)
    temp_prev = ladder.plans.get(prev)
    grow = (f"{trial.temp / 2**30:.2f} GiB planned temporaries, {trial.temp / temp_prev:.2f}x {prev}'s"
            if trial.temp and temp_prev else "planned temporaries not known for both")
    notes = [f"regime: per-step costs that do not grow with the batch (kernel launches, the AdamW "
             f"update of every parameter, host dispatch) shared by {k}x the tokens of the big batch",
             f"price: {grow}"]
    return _record(ladder, name, label, trial, cand, prev, notes)


@beyond_rung("B5", lambda ladder: f"+batch {2 * ladder.config.big_batch}")
def b5_batch2(ladder: Ladder, prev: str, base: Recipe, name: str, label: str) -> RungResult:
    """Twice the big batch, on the fastest configuration so far."""
    return _batch_rung(ladder, prev, base, name, label, 2)


@beyond_rung("B6", lambda ladder: f"batch {4 * ladder.config.big_batch}")
def b6_batch4(ladder: Ladder, prev: str, base: Recipe, name: str, label: str) -> RungResult:
    """Four times the big batch, on the fastest configuration so far."""
    return _batch_rung(ladder, prev, base, name, label, 4)


BEYOND = {"B1": b1_embed_fp32, "B2": b2_onehot, "B3": b3_split_step, "B4": b4_cudnn,
          "B5": b5_batch2, "B6": b6_batch4}


# -- kernel breakdown of the fastest configuration -----------------------------------------
def kernel_report(ladder: Ladder, steps: int | None = None, warmup: int = 3,
                  top: int = 12) -> KernelBreakdown | None:
    """Profile the fastest configuration (outside any timed window); its kernel breakdown.

    Stored as ``extra['kernels']`` (``KernelBreakdown.to_dict()``) of the fastest rung. A
    profiler failure does not end the ladder: it is recorded in that rung's
    ``extra['kernels_error']`` and in the result's notes, and ``None`` is returned.
    """
    name, recipe = fastest(ladder)
    steps = steps if steps is not None else (2 if ladder.config.is_smoke else 5)
    try:
        rung = ladder.result.rung(name)
    except KeyError:
        rung = None
    try:
        runner = Runner(ladder, recipe)
        stream = ladder.stream(recipe.batch_size)
        X, Y = first_batch(stream)
        text = compiled_hlo_text(runner.jitted, *runner.lower_args(X, Y))
        kb = kernel_breakdown(runner.step, stream, steps=steps, warmup=warmup, top=top, hlo_text=text)
        runner.commit()
    except Exception as e:
        msg = f"{type(e).__name__}: {e}"[:2000]
        if rung is not None:
            rung.extra["kernels_error"] = msg
        ladder.result.notes.append(f"kernel breakdown of {name} ({recipe}) failed: {msg}")
        return None
    finally:
        gc.collect()
    if rung is not None:
        rung.extra["kernels"] = kb.to_dict()
        rung.extra["kernels_recipe"] = recipe.to_dict()
    return kb
