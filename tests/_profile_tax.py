"""A fresh process that times the smoke step one window at a time, on command, for the
profiler-tax test of tests/torch/test_profile.py.

    python tests/_profile_tax.py STEPS     # then, one per line on stdin:
        window    -> prints the tokens/s of one window of STEPS steps (perfladder's timer)
        profile   -> runs kernel_breakdown over 5 steps, prints 'profiled DEVICE TOTAL_US'
        quit

It prints 'ready' once its step is built and warmed up. Two of them take turns, so that
whatever drifts with time (the clocks of a lightly loaded device, the host's boost, what an
earlier test left in its process) drifts for both alike; only one of them is profiled.
"""
from __future__ import annotations

import sys


def main(steps: int) -> int:
    from perfladder.config import get_config
    from perfladder.torch import TorchLab, kernel_breakdown, throughput
    from perfladder.torch.kernels import quiet_kineto

    lab = TorchLab(get_config("smoke"))
    step = lab.build_step(lab.seed_recipe())
    stream = lab.stream(lab.config.batch_size)
    throughput(step, stream, warmup=100, timed=steps, windows=1, target_spread=0.99, max_windows=1)
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "window":
            t = throughput(step, stream, warmup=0, timed=steps, windows=1, target_spread=0.99,
                           max_windows=1)
            print(t.tokens_per_s, flush=True)
        elif command == "profile":
            with quiet_kineto():
                kb = kernel_breakdown(step, stream, steps=5)
            print("profiled", kb.device, kb.total_us, flush=True)
        elif command == "quit":
            return 0
        else:
            print(f"unknown command {command!r}; valid: window, profile, quit", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
