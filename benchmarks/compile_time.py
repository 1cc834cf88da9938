"""Where a rung's compile time goes, on a GPU: the PyTorch step's first call broken down by
``torch._dynamo.utils.compile_times`` and the profiler's top functions, and the JAX step's
lower and compile with and without XLA's autotuning, alone and beside a gate program's compile.

    PYTHONPATH=src python3 benchmarks/compile_time.py [--framework torch|jax|both]

Prints its findings; nothing is written. Run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import threading
import time

CONFIG = "full"


def torch_part() -> None:
    import torch
    import torch._dynamo.utils as du
    import torch._inductor.config as ic

    from perfladder.config import get_config
    from perfladder.torch.lab import TorchLab
    from perfladder.torch.recipe import Recipe

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    print("inductor compile_threads:", ic.compile_threads, flush=True)
    lab = TorchLab(get_config(CONFIG))
    for i, recipe in enumerate([Recipe(64, compiled=True),
                                Recipe(512, compiled=True, bf16=True, optimizer="fused"),
                                Recipe(1024, compiled=True, bf16=True, optimizer="fused")]):
        step = lab.build_step(recipe)
        X, Y = next(lab.stream(recipe.batch_size))
        prof = cProfile.Profile() if i == 1 else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        step(X, Y)
        sync()
        if prof:
            prof.disable()
        print(f"\n== torch {recipe}: first call {time.perf_counter() - t0:.1f} s"
              f"{' (under cProfile)' if prof else ''}", flush=True)
        print(du.compile_times(repr="str", aggregate=True), flush=True)
        if prof:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(60)
            print(s.getvalue()[:12000], flush=True)
        t0 = time.perf_counter()
        step(X, Y)
        sync()
        print(f"second call {time.perf_counter() - t0:.3f} s", flush=True)
        del step
        lab.reset_memory()


def jax_part() -> None:
    import jax

    from perfladder.config import get_config
    from perfladder.jax.gate_programs import GATE_COMPILE, step_gradients
    from perfladder.jax.lab import JaxLab
    from perfladder.jax.recipe import Recipe

    lab = JaxLab(get_config(CONFIG))
    jax.config.update("jax_enable_compilation_cache", False)

    def lowered(batch, **kw):
        step = lab.build_step(Recipe(batch_size=batch, **kw))
        X, Y = next(lab.stream(batch))
        t0 = time.perf_counter()
        low = step.lower(X, Y)
        return step, low, time.perf_counter() - t0

    def compile_s(low, options=None):
        t0 = time.perf_counter()
        low.compile(compiler_options=options) if options else low.compile()
        return time.perf_counter() - t0

    def gate_lowered(batch, rows, **kw):
        step = lab.build_step(Recipe(batch_size=batch, **kw))
        X, Y = next(lab.stream(batch))
        fn = lab.code["train_step"]
        from flax import nnx
        gd, st = nnx.split(step.model)
        t0 = time.perf_counter()
        low = jax.jit(lambda s, X, Y: step_gradients(fn, nnx.merge(gd, s), X, Y),
                      compiler_options=GATE_COMPILE).lower(st, X[:rows], Y[:rows])
        return low, time.perf_counter() - t0

    for batch, kw in [(512, {}), (512, {"dtype": "bfloat16"})]:
        _, low, tl = lowered(batch, **kw)
        print(f"\n== jax batch {batch} {kw}: lower {tl:.1f} s, compile (autotune) "
              f"{compile_s(low):.1f} s", flush=True)
        _, low, tl = lowered(batch + 8, **kw)
        print(f"   batch {batch + 8}: compile autotune 0: {compile_s(low, GATE_COMPILE):.1f} s", flush=True)
        glow, tg = gate_lowered(batch, 8, **kw)
        print(f"   gate program (8 rows) lower {tg:.1f} s compile {compile_s(glow):.1f} s", flush=True)
        # the two compiles side by side: the step with autotuning, a gate program without
        _, low, _ = lowered(batch + 16, **kw)
        glow, _ = gate_lowered(batch, 16, **kw)
        out = {}
        th = threading.Thread(target=lambda: out.setdefault("gate", compile_s(glow)))
        t0 = time.perf_counter()
        th.start()
        out["step"] = compile_s(low)
        th.join()
        print(f"   side by side: step {out['step']:.1f} s, gate {out['gate']:.1f} s, wall "
              f"{time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=("torch", "jax", "both"), default="both")
    p.add_argument("--config", default="full")
    a = p.parse_args()
    CONFIG = a.config
    if a.framework in ("torch", "both"):
        torch_part()
    if a.framework in ("jax", "both"):
        jax_part()
