"""Every GEMM shape of the model's training step, timed under each way PyTorch can run it.

    python benchmarks/gemm_algorithms_torch.py --out benchmarks/results/h200-gemm-algorithms/torch_gemms.json
    python benchmarks/gemm_algorithms_torch.py --smoke --out /tmp/torch_gemms.json   # CPU: not results

For the issue's levers 3 (each GEMM's algorithm chosen by timing, rung B17) and 4a (the bias
gradient in the weight-gradient GEMM's epilogue, rung B18). The shapes are the full config's at
the batch given (default: the ladder's batch 2048, 262,144 tokens), bf16: per block the QKV
projection, attention's output projection, FC1 and FC2, and once per step the tied LM head; for
each its forward GEMM (``y = x W^T + b``), input gradient (``dx = dy W``) and weight gradient
(``dW = dy^T x``). Options (``OPTIONS``):

* ``torch``: ``F.linear`` / ``mm`` as autograd calls them (PyTorch's default BLAS choice);
* ``cublaslt``: the same calls under ``torch.backends.cuda.preferred_blas_library("cublaslt")``;
* ``nvmath``: ``perfladder.torch.fused.gemm``'s operators on nvmath plans keeping cuBLASLt's
  heuristic first algorithm (the operand arrangement of rung B17, untuned);
* ``nvmath_tuned``: the same after ``Matmul.autotune`` (each algorithm timed, the fastest kept:
  what B17 runs);
* ``transposed``: the weight stored transposed, (K, O): ``x @ Wt``, ``dy @ Wt^T``, ``x^T dy``
  (the other operand layout, so a different cuBLAS transpose case).

Bias gradient (``bias_grad``), per linear layer: the weight-gradient GEMM plus a separate
``dy.sum(0)`` (``torch``; ``nvmath_tuned``) against one tuned GEMM with cuBLASLt's ``BGRADB``
epilogue writing both (``nvmath_bgradb``: B18).

Each time is the median of ``--reps`` CUDA-event timings after ``--warmup`` calls; TFLOP/s is
``2 M N K`` over it. ``per_step_ms`` adds each option's GEMMs as one training step runs them
(the layer GEMMs once per block, the head once); an option with a shape not measured has no
total. Every option's result is also checked against ``torch``'s (``rel_err``); the nvmath
options record the cuBLASLt algorithm their plan runs (``algorithm``). Results go to
the JSON atomically after every shape (an existing file is replaced only by a complete write);
a short table goes to stdout. Without CUDA it refuses in one line (``--smoke`` runs the smoke
config's shapes on CPU, the nvmath options on ``fused.epilogue``'s stand-in backend: a test of
the tool, not a measurement); without nvmath-python its options are recorded as not measured,
saying why.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

OPTIONS = ("torch", "cublaslt", "nvmath", "nvmath_tuned", "transposed")
BIAS_OPTIONS = ("torch", "nvmath_tuned", "nvmath_bgradb")
GEMMS = ("fwd", "dgrad", "wgrad")
NVMATH = ("nvmath", "nvmath_tuned", "nvmath_bgradb")
WHAT = "the nvmath options of benchmarks/gemm_algorithms_torch.py"


def layers(g) -> list[tuple[str, int, int, bool, int]]:
    """``[(name, K, O, has bias, times per step)]``: the model's linear layers and the head."""
    D, Fw = g.num_hiddens, g.ffn_mult * g.num_hiddens
    return [("qkv", D, 3 * D, True, g.num_blks), ("attn_out", D, D, True, g.num_blks),
            ("fc1", D, Fw, True, g.num_blks), ("fc2", Fw, D, True, g.num_blks),
            ("lm_head", D, g.vocab_size, False, 1)]


def timer(cuda: bool, reps: int, warmup: int):
    """``median_ms(fn)``: CUDA events around each call on a GPU, wall clock on CPU."""
    import torch

    def median_ms(fn) -> float:
        for _ in range(warmup):
            fn()
        if not cuda:
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t0))
            return statistics.median(times)
        torch.cuda.synchronize()
        marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(reps)]
        for start, end in marks:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in marks)
    return median_ms


def calls(option: str, x, w, wt, b, dy) -> dict:
    """``{gemm: fn}``: each GEMM of one linear layer as ``option`` runs it, each returning its
    result in torch's layout (the transposed weight's gradient as a view) for the check."""
    import torch
    import torch.nn.functional as F

    from perfladder.torch.fused import gemm
    if option in ("torch", "cublaslt"):
        return {"fwd": lambda: F.linear(x, w, b), "dgrad": lambda: torch.mm(dy, w),
                "wgrad": lambda: torch.mm(dy.t(), x)}
    if option == "transposed":
        return {"fwd": lambda: torch.mm(x, wt) if b is None else torch.addmm(b, x, wt),
                "dgrad": lambda: torch.mm(dy, wt.t()), "wgrad": lambda: torch.mm(x.t(), dy).t()}
    return {"fwd": lambda: gemm.linear_fwd(x, w, b, False), "dgrad": lambda: gemm.dgrad(dy, w),
            "wgrad": lambda: gemm.wgrad(dy, x)}


def rel_err(got, want) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()


def timed(fn, want, flop: int, median_ms) -> dict:
    """``fn``'s median ms and TFLOP/s, and its results' largest relative error against ``want``
    (the first call makes its plans); a library that refuses the shape is recorded in one line
    (``not_measured``), the other shapes and options still measured."""
    try:
        got = fn()
    except Exception as e:                                         # noqa: BLE001 (cuBLASLt's refusal)
        return {"not_measured": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    pairs = zip(got, want) if isinstance(want, tuple) else [(got, want)]
    err = max(rel_err(a, b) for a, b in pairs)
    ms = median_ms(fn)
    return {"ms": ms, "tflops": flop / ms / 1e9, "rel_err": err}


def algorithm_of(plans) -> dict:
    """``{"algorithm": id}`` of the plan made last (nvmath orders a plan's algorithms, fastest
    first once autotuned, and runs the first), so the heuristic and the tuned choice can be
    told apart; empty for PyTorch's own calls and the stand-in."""
    if plans is None or not plans.plans:
        return {}
    algorithms = getattr(list(plans.plans.values())[-1], "algorithms", None)
    found = getattr(algorithms[0], "algorithm_id", None) if algorithms else None
    return {} if found is None else {"algorithm": int(found)}


@contextlib.contextmanager
def option_context(option: str, backend, iterations: int):
    """What ``option`` runs under: PyTorch's BLAS preference, or fresh nvmath plans (autotuned
    or not) on ``backend``, yielded; the previous settings restored after."""
    import torch

    from perfladder.torch.fused import epilogue as ep
    from perfladder.torch.fused import gemm
    if option == "cublaslt":
        before = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        try:
            yield
        finally:
            torch.backends.cuda.preferred_blas_library(before)
    elif option in NVMATH:
        with ep.use_backend(backend) as plans, gemm.autotuning(0 if option == "nvmath" else iterations):
            yield plans
    else:
        yield None


def not_measured(cuda: bool, missing: str | None) -> dict:
    """``{option: why}`` for the options this machine cannot run."""
    out = {}
    if missing:
        out.update({o: missing for o in NVMATH})
    if not cuda:
        out["cublaslt"] = "PyTorch's BLAS preference applies to CUDA only (this is a CPU smoke run)"
    return out


def measure_layer(name, K, O, bias, N, dev, median_ms, backend, iterations, skip) -> dict:
    """One layer's rows: ``{"gemms": {gemm: row}, "bias_grad": row or None}``."""
    import torch

    from perfladder.torch.fused import gemm
    gen = torch.Generator(device=dev).manual_seed(0)
    bf = torch.bfloat16
    x, dy = (torch.randn(N, k, device=dev, dtype=bf, generator=gen) for k in (K, O))
    w = (0.02 * torch.randn(O, K, device=dev, generator=gen)).to(bf)
    b = torch.randn(O, device=dev, dtype=bf, generator=gen) if bias else None
    wt = w.t().contiguous()
    flop = {"fwd": 2 * N * K * O, "dgrad": 2 * N * O * K, "wgrad": 2 * O * N * K}
    shape = {"fwd": (N, O, K), "dgrad": (N, K, O), "wgrad": (O, K, N)}
    rows = {g: {"M": shape[g][0], "N": shape[g][1], "K": shape[g][2], "flop": flop[g], "options": {}}
            for g in GEMMS}
    want = {g: f() for g, f in calls("torch", x, w, wt, b, dy).items()}
    for option in OPTIONS:
        for g in GEMMS:
            if option in skip:
                rows[g]["options"][option] = {"not_measured": skip[option]}
        if option in skip:
            continue
        with option_context(option, backend, iterations) as plans:
            for g, fn in calls(option, x, w, wt, b, dy).items():
                rows[g]["options"][option] = {**timed(fn, want[g], flop[g], median_ms),
                                              **algorithm_of(plans)}
    if not bias:
        return {"gemms": rows, "bias_grad": None}
    row = {"flop": flop["wgrad"], "options": {}}
    db_want = dy.float().sum(0)
    for option in BIAS_OPTIONS:
        if option in skip:
            row["options"][option] = {"not_measured": skip[option]}
            continue
        if option == "torch":
            fn = lambda: (torch.mm(dy.t(), x), dy.sum(0))               # noqa: E731
        elif option == "nvmath_tuned":
            fn = lambda: (gemm.wgrad(dy, x), dy.sum(0))                 # noqa: E731
        else:
            fn = lambda: gemm.wgrad_bgrad(dy, x)                        # noqa: E731
        with option_context(option, backend, iterations) as plans:
            row["options"][option] = {**timed(fn, (want["wgrad"], db_want), flop["wgrad"], median_ms),
                                      **algorithm_of(plans)}
    return {"gemms": rows, "bias_grad": row}


def per_step(result: dict) -> dict:
    """``{option: ms}``: each option's GEMMs as one step runs them; None where one is missing."""
    totals = {}
    for option in OPTIONS:
        ms = [(r["options"][option].get("ms"), layer["per_step"]) for layer in result["layers"].values()
              for r in layer["gemms"].values()]
        totals[option] = None if any(m is None for m, _ in ms) else sum(m * n for m, n in ms)
    return totals


def table(result: dict) -> str:
    """The short stdout table: ms (TFLOP/s) per GEMM and option, the per-step totals."""
    head = f"{'gemm':<16}" + "".join(f"{o:>20}" for o in OPTIONS)
    lines = [head]
    for name, layer in result["layers"].items():
        for g, r in layer["gemms"].items():
            cells = [(f"{c['ms']:.3f} ({c['tflops']:.0f})" if "ms" in c else "-") for c in
                     (r["options"][o] for o in OPTIONS)]
            lines.append(f"{name + ' ' + g:<16}" + "".join(f"{c:>20}" for c in cells))
    lines.append(f"{'per step ms':<16}" + "".join(
        f"{'-' if v is None else format(v, '.2f'):>20}" for v in result["per_step_ms"].values()))
    for name, layer in result["layers"].items():
        if layer["bias_grad"]:
            lines.append(f"{name} dW+db: " + ", ".join(
                f"{o} {c['ms']:.3f} ms" if "ms" in c else f"{o} -"
                for o, c in layer["bias_grad"]["options"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the results JSON (.json)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default: 2048; smoke: 32)")
    p.add_argument("--reps", type=int, default=50, help="timed calls per GEMM (the median is kept)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--autotune-iterations", type=int, default=None,
                   help="Matmul.autotune's timings per algorithm (default: fused.gemm's)")
    p.add_argument("--smoke", action="store_true", help="the smoke config on CPU; numbers are not results")
    args = p.parse_args(argv)
    for opt in ("batch", "reps", "warmup", "autotune_iterations"):
        v = getattr(args, opt)
        if v is not None and v < (0 if opt == "warmup" else 1):
            print(f"gemm_algorithms_torch: --{opt.replace('_', '-')} {v} is not valid; give a "
                  f"{'non-negative' if opt == 'warmup' else 'positive'} integer", file=sys.stderr)
            return 2

    from perfladder.config import get_config
    from perfladder.outputs import OutputError, check_output_path, replace_atomically
    try:
        out = check_output_path(args.out, "json", "--out")
    except OutputError as e:
        print(f"gemm_algorithms_torch: {e}", file=sys.stderr)
        return 2
    import torch

    from perfladder.torch.fused import epilogue as ep
    from perfladder.torch.fused import gemm
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("gemm_algorithms_torch: no CUDA GPU here; the GEMMs it times are cuBLAS's and cuBLASLt's "
              "(--smoke runs the smoke config's shapes on CPU, not a measurement)", file=sys.stderr)
        return 2
    cfg = get_config("smoke" if args.smoke else "full")
    g = cfg.gpt()
    batch = args.batch or (cfg.big_batch if args.smoke else 4 * cfg.big_batch)
    N = batch * cfg.num_steps
    dev = torch.device("cuda" if cuda else "cpu")
    missing = ep.nvmath_missing(WHAT) if cuda else None
    backend = ep.STAND_IN
    if cuda and not missing:
        import nvmath.linalg.advanced as backend
    iterations = args.autotune_iterations or gemm.AUTOTUNE_ITERATIONS
    skip = not_measured(cuda, missing)
    result = {"tool": "benchmarks/gemm_algorithms_torch.py", "smoke": args.smoke,
              "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
              "torch": torch.__version__, "nvmath": None, "backend": "nvmath (cuBLASLt)" if cuda else
              "stand-in: PyTorch ops on CPU, not cuBLASLt", "dtype": "bfloat16", "batch": batch,
              "seq_len": cfg.num_steps, "tokens": N, "reps": args.reps, "warmup": args.warmup,
              "autotune_iterations": iterations, "options": list(OPTIONS),
              "not_measured": skip, "complete": False, "layers": {}, "per_step_ms": {}}
    if cuda and not missing:
        import nvmath
        result["nvmath"] = getattr(nvmath, "__version__", "unknown")
    median_ms = timer(cuda, args.reps, args.warmup)
    for name, K, O, bias, n in layers(g):
        rows = measure_layer(name, K, O, bias, N, dev, median_ms, backend, iterations, skip)
        result["layers"][name] = {"K": K, "O": O, "bias": bias, "per_step": n, **rows}
        result["per_step_ms"] = per_step(result)           # of the layers so far until complete
        result["complete"] = name == "lm_head"
        replace_atomically(out, (json.dumps(result, indent=1) + "\n").encode())
    print(table(result))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    raise SystemExit(main())
