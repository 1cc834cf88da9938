"""How long XLA takes to compile one JAX training step, stage by stage, and with its kernels'
LLVM compilation spread over threads: the same optimized program (compared as text), timed.

    PYTHONPATH=src TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=gpu_compiler=1,nvptx_compiler=1 \
        python3 benchmarks/xla_compile_flags.py
"""
import sys
import time

import jax

from perfladder.config import get_config
from perfladder.jax.lab import JaxLab
from perfladder.jax.recipe import Recipe

PARALLEL = {"xla_gpu_force_compilation_parallelism": 16}
ONLY_DEFAULT = "--once" in sys.argv

lab = JaxLab(get_config("full"))
jax.config.update("jax_enable_compilation_cache", False)
for kw in ({}, {"dtype": "bfloat16"})[:1 if ONLY_DEFAULT else 2]:
    step = lab.build_step(Recipe(batch_size=512, **kw))
    X, Y = next(lab.stream(512))
    low = step.lower(X, Y)
    texts = {}
    runs = (("default", None), ("parallel", PARALLEL), ("default again", None))
    for name, opts in runs[:1 if ONLY_DEFAULT else 3]:
        t0 = time.perf_counter()
        c = low.compile(compiler_options=opts) if opts else low.compile()
        print(f"== {kw} {name}: compile {time.perf_counter() - t0:.1f} s", flush=True)
        texts[name] = c.as_text()
    if ONLY_DEFAULT:
        break
    print("same optimized HLO (default vs parallel):", texts["default"] == texts["parallel"],
          "(default vs default again):", texts["default"] == texts["default again"], flush=True)
