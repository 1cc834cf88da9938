"""Where the JAX step-form gate's seconds go, on a GPU: every XLA compilation it makes, by
program, with its seconds, for the 'nnx' and the 'split' form (each once per ladder).

    PYTHONPATH=src python3 benchmarks/step_form_gate_time.py [--config full]

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
    a = p.parse_args()
    import jax

    from perfladder.config import get_config
    from perfladder.jax import trial
    from perfladder.jax.lab import JaxLab
    from perfladder.jax.recipe import Recipe

    lab = JaxLab(get_config(a.config))
    c = lab.config
    warm = lab.build_step(Recipe(batch_size=c.batch_size))    # the model's init ops, as R1 has
    jax.block_until_ready(warm(*next(lab.stream(c.batch_size))))
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


if __name__ == "__main__":
    main()
