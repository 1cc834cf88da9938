"""The chapter's own RTX 4090 run, shaped as a ladder result, to read the pages against
(framework-free).

The chapter printed its rates (transcribed once, with their source, in
``perfladder.pages.comparison.CHAPTER``) and said in words what set the pace of its batch-64
steps; those readings are paraphrased here (``SEED_PACE``), each with what it rests on.
``seed_shaped_run(template)`` is a committed run (``template``) with the chapter's rates put on
its seed rungs, its batch-64 profiles set to the chapter's pace, and every rung the chapter did
not run left unmeasured, so that a test can render
the pages as they would read on the chapter's machine and check that no printed sentence is
false there.
"""
from __future__ import annotations

import copy

from perfladder.pages.chapter.machine import CHAPTER_GPU
from perfladder.pages.comparison import CHAPTER
from perfladder.results.record import LadderResult

HOST, DEVICE = "host", "device"
# what set the pace of the chapter's batch-64 steps, as its section 13.7 reads them (paraphrased;
# the seed text of the chapter is the source)
SEED_PACE = {
    "torch": {
        "R0": (DEVICE, "compile pays about 1.3x, which the chapter reads as a model not bound by overhead"),
        "R1": (DEVICE, "fusion turns the elementwise chains into a few generated kernels, and its "
                       "re-profile finds the matmuls on top"),
        "R2": (DEVICE, "bf16 pays about 1.4x more, the chapter crediting the tensor cores"),
    },
    "jax": {
        "R1": (HOST, "jit's kernels only partly hide the dispatch, in the chapter's reading"),
        "R2a": (HOST, "the naive cast runs the fp32 program at the same batch"),
        "R2": (HOST, "the chapter calls its bf16 step at batch 64 overhead-bound, as in Section 13.1"),
    },
}
BUSY = {HOST: 0.35, DEVICE: 0.95}        # kernels' share of the step a profile of each pace shows
# a profile's times per step (``measure.evidence.ProfileSummary``): each scales with the step
PROFILE_MS = ("device_ms", "host_ms", "busy_ms", "wall_ms")


def seed_shaped_run(template: LadderResult) -> LadderResult:
    """``template`` (a committed run of the same framework) with the chapter's rates on its seed
    rungs and the chapter's pace on its batch-64 profiles; every other rung as it was."""
    run = copy.deepcopy(template)
    run.device = CHAPTER_GPU
    rates = CHAPTER[run.framework]
    for r in run.rungs:
        if r.name not in rates or not r.measured:      # a rung the chapter did not run
            r.tokens_per_s, r.timing, r.outcome = None, None, "not_measured"
            r.error = "not a rung of the chapter's ladder"
            continue
        slower = r.tokens_per_s / rates[r.name]       # the chapter's step takes this much longer
        r.tokens_per_s = rates[r.name]
        if r.profile is not None:                      # the same pace, at the chapter's rate
            for field in PROFILE_MS:
                ms = getattr(r.profile, field)
                setattr(r.profile, field, None if ms is None else ms * slower)
        if r.timing is not None:           # settled windows a hair apart, as a steady device gives
            r.timing.windows = [rates[r.name] * f for f in (0.995, 1.0, 1.005)]
            r.timing.seconds = list(r.timing.seconds[-3:]) or [1.0, 1.0, 1.0]
            r.timing.settled, r.timing.stable = 3, True
        pace = SEED_PACE[run.framework].get(r.name)
        if pace is not None and r.profile is not None and r.batch_size and r.seq_len:
            step_ms = 1e3 * r.batch_size * r.seq_len / r.tokens_per_s
            r.profile.device_ms = BUSY[pace[0]] * step_ms
            if r.profile.busy_ms is not None:          # a profile that recorded the kernels' union
                r.profile.busy_ms, r.profile.wall_ms = BUSY[pace[0]] * step_ms, step_ms
            r.profile.host_ms = (0.5 if pace[0] == DEVICE else 0.95) * step_ms
    run.roofs = None                    # the chapter published no probe of its GPU
    run.learning, run.fastest = None, None
    return run.finalize()
