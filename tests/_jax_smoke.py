"""One smoke run of the whole JAX ladder per pytest process, shared by the test modules.

``test_jax_rungs.py`` (the seed rungs) and ``test_jax_beyond.py`` (the B rungs, the kernel
report, the learning check of the fastest configuration) both read the same run instead
of running the ladder twice. Import this only after ``fast_cpu_compiles()`` was called.
"""
import functools


@functools.lru_cache(maxsize=1)
def smoke_run():
    """(ladder, progress events) after every rung, the kernel report and the learning check."""
    from perfladder.config import get_config
    from perfladder.jax import Ladder, run_ladder

    cfg = get_config("smoke")
    events = []
    ladder = Ladder(cfg, command="pytest")
    result = run_ladder(cfg, progress=lambda e, n, p: events.append((e, n, p)), ladder=ladder,
                        command="pytest")
    assert result is ladder.result
    return ladder, events
