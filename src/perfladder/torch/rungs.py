"""The PyTorch ladder: R0 (eager) .. R5 (DDP), the learning check, and ``run_ladder``.

Each rung is one move on top of the last -- profile / classify, fix, gate, re-measure:

    R0  eager fp32 (TF32 matmuls), profiled          the baseline
    R1  + torch.compile                              gate: compiled logits == eager logits
    R2  + bf16 autocast (fp32 loss)                  receipt: logits are bf16
    R3c fp32 eager at the big batch (control)        what the batch costs without bf16
    R3  + big batch                                  re-profiled, peak memory
    R4  + activation checkpointing (negative rung)   gate: checkpointed model is a mirror
    R5  DDP over 2 / 4 GPUs                          cost-model floor written down first
    B1.. beyond the seed (``perfladder.torch.beyond``), from the last winning rung, R3

The learning check trains the fastest configuration the ladder measured (R3's recipe unless
a B rung beat it).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from functools import partial

import torch

from ..driver import drive
from ..hardware import achieved_tflops, mfu
from ..results import LadderResult, RungResult, smoothed_check
from . import beyond as _beyond
from . import ddp as _ddp
from .gates import COMPILE_ATOL, COMPILE_RTOL, MIRROR_ATOL, check_bf16, check_compiled, check_mirror
from .ladder import NOT_ON_CPU_MEM, Ladder
from .profile import profile_table
from .timer import sync


def _cpu_bf16_note(ladder: Ladder) -> list[str]:
    return [] if ladder.on_gpu else [
        "bf16 via torch.autocast('cpu'): the CPU equivalent of CUDA autocast (linear/matmul "
        "in bf16 on the CPU's kernels; no tensor cores, so no speed-up is expected here)"]


# -- R0 ------------------------------------------------------------------------------------------
def r0_eager(ladder: Ladder) -> RungResult:
    """Eager fp32 (TF32 matmuls on a GPU) at the seed's batch; profiled before it is timed."""
    B = ladder.config.batch_size
    step = ladder.fresh_step(compiled=False, bf16=False)
    stream = ladder.stream(B)
    for _ in range(3):                                   # let the allocator and kernels settle
        step(*next(stream))
    sync()
    table = profile_table(step, stream, steps=ladder.profile_steps)
    notes = ["profiled before timing with TEARDOWN_CUPTI=1: the profiler's instrumentation "
             "is gone when its block ends, so this timing pays no profiling tax",
             "fp32 with torch.set_float32_matmul_precision('high')"
             + (" (TF32 tensor cores)" if ladder.on_gpu else " (no TF32 on CPU)")]
    return ladder.timed_rung("R0", "eager", step, batch_size=B, bf16=False, notes=notes,
                             extra={"profile": table})


# -- R1 ------------------------------------------------------------------------------------------
def compile_gate(eager_model, compiled_model, X, atol: float = COMPILE_ATOL,
                 rtol: float = COMPILE_RTOL) -> float:
    """R1's correctness gate (``check_compiled``): raises ``CorrectnessError`` on a wrong model."""
    return check_compiled(eager_model, compiled_model, X, atol=atol, rtol=rtol)


def r1_compile(ladder: Ladder) -> RungResult:
    """+ torch.compile: compile time, correctness gate, re-profile, then time."""
    B = ladder.config.batch_size
    step = ladder.fresh_step(compiled=True, bf16=False)
    stream = ladder.stream(B)
    sync()
    t0 = time.perf_counter()
    step(*next(stream))                                  # the first call compiles fwd + bwd
    sync()
    compile_s = time.perf_counter() - t0
    X, _ = next(stream)
    diff = compile_gate(step.model, step.forward, X)
    table = profile_table(step, stream, steps=ladder.profile_steps)
    notes = [f"first (compiling) step: {compile_s:.1f} s",
             f"gate: compiled logits == eager within atol={COMPILE_ATOL}, rtol={COMPILE_RTOL} "
             f"(max |diff| {diff:.2g})",
             "torch.compile(dynamic=False): one static batch shape, any retrace is an error"]
    return ladder.timed_rung("R1", "compile", step, batch_size=B, bf16=False, notes=notes,
                             extra={"compile_s": compile_s, "gate_max_abs_diff": diff,
                                    "profile": table})


# -- R2 ------------------------------------------------------------------------------------------
def bf16_receipt(step, X) -> str:
    """The logits a bf16 step produces inside autocast must be bf16 (``PrecisionError`` if not)."""
    return check_bf16(step.logits(X).detach())


def r2_bf16(ladder: Ladder) -> RungResult:
    """+ bf16 autocast (loss in fp32), compiled, at the seed's batch."""
    B = ladder.config.batch_size
    step = ladder.fresh_step(compiled=True, bf16=True)
    stream = ladder.stream(B)
    step(*next(stream))                                  # compile outside any timing
    receipt = bf16_receipt(step, next(stream)[0])
    notes = [f"receipt: logits inside autocast are {receipt}; loss computed in fp32",
             *_cpu_bf16_note(ladder)]
    return ladder.timed_rung("R2", "+bf16", step, batch_size=B, bf16=True, notes=notes,
                             extra={"logits_dtype": receipt})


# -- R3c / R3 --------------------------------------------------------------------------------------
def r3c_fp32_control(ladder: Ladder) -> RungResult:
    """Control: fp32 *eager* (as in the seed) at the big batch -- its speed and peak memory."""
    B = ladder.config.big_batch
    step = ladder.fresh_step(compiled=False, bf16=False)
    notes = ["control, not a waterfall rung: fp32 eager (not compiled, as in the seed) at the "
             "big batch, to price what the batch costs without bf16 (compare peak memory with R3)"]
    return ladder.timed_rung("R3c", "fp32 eager @ big batch", step, batch_size=B, bf16=False,
                             kind="control", notes=notes)


def _peak_note(ladder, name: str, what: str) -> list[str]:
    """``['<what> peaked at X GiB']`` from rung ``name``'s recorded peak, or ``[]`` if none."""
    try:
        peak = ladder.result.rung(name).peak_mem_bytes
    except KeyError:
        return []
    return [] if peak is None else [f"{what} peaked at {peak / 2**30:.2f} GiB"]


def r3_batch(ladder: Ladder) -> RungResult:
    """+ big batch (compiled, bf16): raises arithmetic intensity; re-profiled."""
    B = ladder.config.big_batch
    step = ladder.fresh_step(compiled=True, bf16=True)
    stream = ladder.stream(B)
    step(*next(stream))                                  # new shape: compile here, not in a window
    receipt = bf16_receipt(step, next(stream)[0])
    table = profile_table(step, stream, steps=ladder.profile_steps)
    notes = [f"batch {ladder.config.batch_size} -> {B}; receipt: logits {receipt}",
             *_cpu_bf16_note(ladder)]
    notes += _peak_note(ladder, "R3c", "fp32 control at the same batch")
    return ladder.timed_rung("R3", "+batch", step, batch_size=B, bf16=True, notes=notes,
                             extra={"profile": table, "logits_dtype": receipt})


# -- R4 ------------------------------------------------------------------------------------------
def mirror_gate(plain, checkpointed, X, atol: float = MIRROR_ATOL) -> float:
    """R4's gate (``check_mirror``): raises ``MirrorError`` if the checkpointed model drifts."""
    return check_mirror(plain, checkpointed, X, atol=atol)


def r4_checkpoint(ladder: Ladder) -> RungResult:
    """+ activation checkpointing per block on top of R3 (expected slower: memory is not binding)."""
    B = ladder.config.big_batch
    plain = ladder.make_model()
    step = ladder.fresh_step(compiled=True, bf16=True, checkpoint=True)
    step.model.load_state_dict(plain.state_dict())
    stream = ladder.stream(B)
    diff = mirror_gate(plain, step.model, next(stream)[0])
    del plain
    step(*next(stream))                                  # compile outside any timing
    notes = [f"gate: checkpointed logits == plain logits in fp32 (atol {MIRROR_ATOL}, "
             f"max |diff| {diff:.2g})",
             "expected a negative rung: recomputing every block's activations costs time, and "
             "memory is not the binding constraint at this size", *_cpu_bf16_note(ladder)]
    notes += _peak_note(ladder, "R3", "R3 (no checkpointing)")
    return ladder.timed_rung("R4", "+checkpoint", step, batch_size=B, bf16=True, notes=notes,
                             extra={"mirror_max_abs_diff": diff})


# -- R5 ------------------------------------------------------------------------------------------
def fast_step_time(ladder: Ladder) -> tuple[float, str]:
    """Seconds per step of the fast single-GPU configuration (R3's); measured here if R3 did not run."""
    if "R3" in ladder.throughputs:
        return ladder.throughputs["R3"].step_time_s, "R3"
    step = ladder.fresh_step(compiled=True, bf16=True)
    tput, _ = ladder.measure(step, ladder.config.big_batch)
    ladder.throughputs["fast (for R5)"] = tput
    return tput.step_time_s, "measured for R5 (R3 not in this run)"


def r5_ddp(ladder: Ladder, ks=(2, 4)) -> RungResult:
    """DDP over k GPUs (k in ``ks`` that are present), fast config per rank; predicted first."""
    n_gpu = torch.cuda.device_count() if ladder.on_gpu else 0
    use = [k for k in ks if k <= n_gpu]
    if not use:
        where = f"{n_gpu} CUDA GPU" + ("" if n_gpu == 1 else "s") + f" on {ladder.device_name}"
        return ladder.add(RungResult(
            name="R5", label="DDP", tokens_per_s=None, kind="skipped",
            notes=[f"data parallelism needs at least 2 GPUs; {where}: not measured (and not "
                   "faked). `ddp_tokens(k, config, backend='gloo')` runs the same worker on CPU."]))
    return ddp_rung(ladder, use, backend="nccl")


def ddp_rung(ladder: Ladder, ks, backend: str, *, compiled: bool = True,
             bf16: bool = True) -> RungResult:
    """Predict (cost model, printed and stored in ``ladder.predictions['R5']``), then launch
    DDP for every k in ``ks`` and add the largest k's measurement as ``R5``."""
    c = ladder.config
    t_comp, source = fast_step_time(ladder)
    B, T, N = c.big_batch, c.num_steps, ladder.num_params
    bus_bw = _ddp.ASSUMED_BUS_BW[backend]
    preds = [_ddp.cost_model_floor(k, B, T, t_comp, N, bus_bw) for k in ks]
    ladder.predictions["R5"] = preds                     # written down before anything runs
    for p in preds:
        print(f"R5 prediction k={p['k']}: t_compute {1e3 * p['t_compute_s']:.1f} ms ({source}) + "
              f"t_comm {1e3 * p['t_comm_s']:.2f} ms at {bus_bw / 1e9:.0f} GB/s -> no-overlap floor "
              f"{p['floor_tokens_per_s']:,.0f} tokens/s (linear {p['linear_tokens_per_s']:,.0f})",
              flush=True)
    runs = []
    for p in preds:
        ladder.reset_memory()                            # hand the ranks the parent's cache
        meas = _ddp.ddp_tokens(p["k"], c, backend=backend, batch_size=B, compiled=compiled,
                               bf16=bf16)
        bw = meas.get("bus_bw_measured")
        floor_meas = (_ddp.cost_model_floor(p["k"], B, T, t_comp, N, bw)["floor_tokens_per_s"]
                      if bw else None)
        runs.append({**p, "measured_tokens_per_s": meas["tokens_per_s"],
                     "measured_windows": meas["windows"], "bus_bw_measured": bw,
                     "floor_at_measured_bw": floor_meas, "peak_mem_bytes": meas["peak_mem_bytes"],
                     "efficiency_vs_linear": meas["tokens_per_s"] / p["linear_tokens_per_s"]})
        print(f"R5 measured k={p['k']}: {meas['tokens_per_s']:,.0f} tokens/s "
              f"({meas['tokens_per_s'] / p['floor_tokens_per_s']:.2f}x the floor, "
              f"{100 * runs[-1]['efficiency_vs_linear']:.0f}% of linear)", flush=True)
    last = runs[-1]
    k, rate = last["k"], last["measured_tokens_per_s"]
    what = ", ".join(w for w, on in (("compiled", compiled), ("bf16", bf16)) if on) or "eager fp32"
    notes = [f"weak scaling: {k} ranks x batch {B} each (global {k * B}), {what}, "
             f"backend {backend}; tokens/s summed over ranks",
             f"cost model written before launch: floor {last['floor_tokens_per_s']:,.0f} tokens/s "
             f"with t_compute from {source} and an assumed {bus_bw / 1e9:g} GB/s allreduce"
             + ("" if last["floor_at_measured_bw"] is None else
                f"; with the bandwidth the ranks measured ({last['bus_bw_measured'] / 1e9:.3g} GB/s) "
                f"the floor is {last['floor_at_measured_bw']:,.0f}"),
             "MFU is per GPU (total rate / k)"]
    for r in runs[:-1]:
        notes.append(f"k={r['k']}: {r['measured_tokens_per_s']:,.0f} tokens/s "
                     f"(floor {r['floor_tokens_per_s']:,.0f})")
    if last["peak_mem_bytes"] is None:
        notes.append(NOT_ON_CPU_MEM)
    windows = last["measured_windows"]
    return ladder.add(RungResult(
        name="R5", label=f"DDP x{k}", tokens_per_s=rate, windows=windows,
        spread=(max(windows) - min(windows)) / rate, batch_size=B, seq_len=T,
        precision="bf16" if bf16 else ladder.fp32_precision(), kind="multi-gpu",
        tflops=achieved_tflops(rate, ladder.flops_per_token),
        mfu=mfu(rate / k, ladder.flops_per_token, ladder.device_name, "bf16" if bf16 else "tf32"),
        peak_mem_bytes=last["peak_mem_bytes"], notes=notes,
        extra={"runs": runs, "t_compute_source": source, "backend": backend}))


# -- the learning check ------------------------------------------------------------------------------
def learning_check(ladder: Ladder, steps: int | None = None, window: int = 20):
    """Train the fastest configuration from a fresh init; assert it learns.

    The fastest configuration is ``ladder.fastest`` when B rungs ran (the recipe of the
    fastest one), else R3's (compiled, bf16, big batch). Losses stay on the device during
    the loop (no host read per step) and are copied to the host once at the end.
    """
    steps = ladder.config.learn_steps if steps is None else steps
    name, recipe = _beyond.fastest(ladder)
    step = _beyond.build_step(ladder, recipe)
    stream = ladder.stream(recipe.batch_size)
    losses = [step(*next(stream)) for _ in range(steps)]          # device scalars
    curve = torch.stack(losses).float().cpu().tolist()            # one host read
    del step
    _beyond._free(ladder)
    check = smoothed_check(curve, window=window)                  # raises if it did not fall
    return ladder.result.set_learning(
        check, f"learning check: {steps} steps of {name}'s configuration ({recipe})")


# -- the ladder ----------------------------------------------------------------------------------------
RUNGS = OrderedDict([
    ("R0", r0_eager),
    ("R1", r1_compile),
    ("R2", r2_bf16),
    ("R3c", r3c_fp32_control),
    ("R3", r3_batch),
    ("R4", r4_checkpoint),
    ("R5", r5_ddp),
    *_beyond.BEYOND.items(),
])
# What ``run_ladder`` (and ``perfladder run torch``) runs unless told: every rung but the
# optional ones (B8's max-autotune compiles take minutes).
DEFAULT_RUNGS = [name for name in RUNGS if name not in _beyond.OPTIONAL]


def check_rungs(rungs, autotune: bool = False) -> list[str]:
    """Rung names in ladder order; unknown names are an error listing the valid ones.

    ``None`` means ``DEFAULT_RUNGS`` (plus the optional B8 when ``autotune``)."""
    if rungs is None:
        return [n for n in RUNGS if n in DEFAULT_RUNGS or (autotune and n in _beyond.OPTIONAL)]
    if isinstance(rungs, str):
        rungs = [rungs]
    unknown = [r for r in rungs if r not in RUNGS]
    if unknown:
        raise ValueError(f"unknown rung(s) {unknown}; valid choices: {list(RUNGS)}")
    return [name for name in RUNGS if name in set(rungs)]


def run_ladder(config, rungs=None, learn: bool = True, progress=None, command: str = "",
               device=None, beyond_autotune: bool = False) -> LadderResult:
    """Run the named rungs (default: ``DEFAULT_RUNGS``; B8 too with ``beyond_autotune``) in
    ladder order, then -- when B rungs ran -- the kernel breakdown of the fastest configuration
    (``beyond.kernel_report``, outside any timed window), then the learning check."""
    names = check_rungs(rungs, autotune=beyond_autotune)
    ladder = Ladder(config, device=device, command=command)
    drive([(name, partial(RUNGS[name], ladder)) for name in names], progress)
    if any(name in _beyond.BEYOND for name in names):
        _beyond.kernel_report(ladder)
    if learn:
        drive([("learning", partial(learning_check, ladder))], progress)
    return ladder.result
