"""A stand-in for ``perfladder.torch``: the real engine and the real CLI on a fake lab whose
rungs take no time, so the fault tests can run whole ladders in a subprocess in a second.

    python tests/_fake_ladder.py run torch --config smoke --out X.json     # the CLI, on it

Environment (all optional):
  FAKE_BLOCK=R2      rung R2 writes FAKE_READY (a file) and then sleeps until it is signalled
  FAKE_READY=path    the file that says the blocking rung has started
  FAKE_SKIP=all      every rung is 'not applicable' (measures nothing)
  FAKE_FAIL=R1,R2    these rungs raise (a failure --resume retries)
  FAKE_CALLS=path    every rung that runs appends its name to this file
  FAKE_BLOCK_FIGURE=1  the waterfall writer starts its file, writes FAKE_READY, then sleeps
"""
from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path

from perfladder.ladder import engine
from perfladder.ladder.rung import Evidence
from perfladder.measure.evidence import Timing
from perfladder.results.record import LadderResult, LearningCheck

NAMES = ("R0", "R1", "R2", "R3")


class Recipe(dict):
    def replace(self, **changes):
        return Recipe({**self, **changes})

    def to_dict(self):
        return dict(self)


class FakeLab:
    framework, baseline, seed_top = "torch", "R0", "R3"
    on_gpu, device_name = False, "cpu"

    def __init__(self, config, command=""):
        self.config = config
        self.result = LadderResult(framework="torch", device="cpu", config=config.to_dict(),
                                   baseline="R0", command=command)

    def seed_recipe(self):
        return Recipe(batch=8)

    def recipe_from_dict(self, d):
        return Recipe(d)

    def free(self):
        pass

    def kernel_report(self, name, recipe):
        return None

    def learning_check(self, name, recipe, watch=None):
        return LearningCheck(steps=40, first=3.0, last=2.0, window=20)

    def use(self, **code):
        pass

    def precision(self, recipe):
        return "fp32"

    def flops_per_token(self, seq_len):
        return 1000


def rung_fn(name: str):
    def fn(lab, given):
        recipe = given.recipe
        if os.environ.get("FAKE_CALLS"):
            with open(os.environ["FAKE_CALLS"], "a") as f:
                f.write(name + "\n")
        if os.environ.get("FAKE_SKIP") == "all":
            raise RuntimeError("not applicable here")
        if name in os.environ.get("FAKE_FAIL", "").split(","):
            raise OSError(28, "No space left on device (planted)")
        if os.environ.get("FAKE_BLOCK") == name:
            Path(os.environ["FAKE_READY"]).write_text(str(os.getpid()))
            while True:                  # until a signal ends it
                time.sleep(0.05)
        rate = 1000.0 * (NAMES.index(name) + 1)
        timing = Timing(windows=[rate] * 3, seconds=[1.0] * 3, settled=3, stable=True,
                        target_spread=0.03, steps_per_window=10, warmup=5, batch_shape=[8, 16])
        return Evidence(timing=timing, recipe=recipe)
    return fn


KEYS = ("eager", "compile", "bf16", "batch_up")       # described techniques (ladder/techniques.py)
RUNGS = engine.registry([
    engine.Rung(n, KEYS[i], f"step {n}", rung_fn(n), builds_on=NAMES[i - 1] if i else None)
    for i, n in enumerate(NAMES)])


def run_ladder(config, rungs=None, learn=True, progress=None, command="", resume=None,
               checkpoint=None, **kw):
    return engine.run_ladder(FakeLab(config, command), RUNGS, rungs, learn=learn,
                             progress=progress, resume=resume, checkpoint=checkpoint)


def module() -> types.ModuleType:
    fake = types.ModuleType("perfladder.torch")
    fake.RUNGS, fake.run_ladder, fake.has_gpu = RUNGS, run_ladder, lambda: False
    return fake


def blocking_waterfall(result, path=None, **kw):
    Path(path).write_bytes(b"half a figure")
    Path(os.environ["FAKE_READY"]).write_text(str(os.getpid()))
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    sys.modules["perfladder.torch"] = module()
    if os.environ.get("FAKE_BLOCK_FIGURE"):
        import perfladder.pages.plot
        perfladder.pages.plot.waterfall = blocking_waterfall
    from perfladder.cli import main
    sys.exit(main(sys.argv[1:]))
