"""Where the JAX step-form gate's seconds go, on a GPU: first the compile of the 'nnx' form's
program alone (the gate's 8 rows of the plain fp32 model) three ways -- at full fp32 matmul
precision as the gate compiles it, the same without XLA's autotuning, and at the default
precision -- then every XLA compilation the gate makes, by program, with its seconds, for the
'nnx' and the 'split' form (each gate runs once per ladder).

    PYTHONPATH=src python3 benchmarks/step_form_gate_time.py --part forms [--config full]
    PYTHONPATH=src python3 benchmarks/step_form_gate_time.py --part gate [--config full]

Each part in its own process, so that neither finds the other's programs or autotuning
results compiled (JAX's persistent compilation cache is off in both).

Prints its findings; nothing is written. Run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import collections
import logging
import re
import time

FINISHED = re.compile(r"Finished XLA compilation of (\S+) in (\S+) sec")


class Compilations(logging.Handler):
    """Collects (program, seconds) of every compilation JAX logs."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.done: list[tuple[str, float]] = []

    def emit(self, record):
        m = FINISHED.search(record.getMessage())
        if m:
            self.done.append((m.group(1), float(m.group(2))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="full")
    p.add_argument("--part", choices=("forms", "gate"), required=True)
    a = p.parse_args()
    import jax

    from perfladder.config import get_config
    from perfladder.jax import trial
    from perfladder.jax.lab import JaxLab
    from perfladder.jax.recipe import Recipe

    lab = JaxLab(get_config(a.config))
    jax.config.update("jax_enable_compilation_cache", False)
    c = lab.config
    warm = lab.build_step(Recipe(batch_size=c.batch_size))    # the model's init ops, as R1 has
    jax.block_until_ready(warm(*next(lab.stream(c.batch_size))))
    if a.part == "forms":
        forms(lab)
        return
    seen = Compilations()
    logging.getLogger("jax").addHandler(seen)
    logging.getLogger("jax").setLevel(logging.DEBUG)
    jax.config.update("jax_log_compiles", True)
    for jit in ("nnx", "split"):
        seen.done.clear()
        t0 = time.perf_counter()
        trial.step_form_gate(lab, Recipe(batch_size=c.big_batch, dtype="bfloat16", jit=jit))
        total = time.perf_counter() - t0
        by = collections.defaultdict(list)
        for name, s in seen.done:
            by[name].append(s)
        print(f"step form {jit!r}: {total:.1f} s, {len(seen.done)} compilations, "
              f"{sum(s for _, s in seen.done):.1f} s of them", flush=True)
        for name, ss in sorted(by.items(), key=lambda kv: -sum(kv[1]))[:8]:
            print(f"  {sum(ss):6.2f} s  {len(ss):3d} x {name}", flush=True)


def forms(lab) -> None:
    """The 'nnx' form's program compiled alone, three ways, each a fresh trace (its own cache
    entry: the options and the precision are part of the key)."""
    import contextlib

    import jax

    from perfladder.jax.gate_programs import GATE_COMPILE
    from perfladder.jax.recipe import Recipe
    from perfladder.jax.step import TrainStep, make_optimizer
    from perfladder.jax.trial import GATE_ROWS, gate_batches

    X, Y = gate_batches(lab, lab.config.batch_size)[0]
    X, Y = X[:GATE_ROWS], Y[:GATE_ROWS]
    plain = Recipe(batch_size=GATE_ROWS, jit="nnx")
    highest = lambda: jax.default_matmul_precision("highest")     # noqa: E731
    for what, precision, options in [("highest precision, no autotuning", highest, GATE_COMPILE),
                                     ("highest precision, autotuned (the gate)", highest, None),
                                     ("default precision, autotuned", contextlib.nullcontext, None)]:
        model = lab.model(plain, plain_code=True)
        step = TrainStep.of(model, make_optimizer(model, lab.config.lr), plain)
        with precision():
            t0 = time.perf_counter()
            lowered = step.lower(X, Y)
            t1 = time.perf_counter()
            lowered.compile(compiler_options=options)
            t2 = time.perf_counter()
        print(f"the nnx form alone, {what}: lower {t1 - t0:.1f} s, compile {t2 - t1:.1f} s", flush=True)


if __name__ == "__main__":
    main()
