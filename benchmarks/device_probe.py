"""Measure the two ceilings of this GPU once: a large bf16 matmul and a device-to-device copy.

    python benchmarks/device_probe.py --out benchmarks/results/h200/device.json

The matmul rate is the measured compute roof a rung's rate is read against (a run's
``LadderResult.roofs``, read from this file by ``perfladder.results.committed.roofs_from_probe``);
the copy rate is the bandwidth roof. Both come from ``perfladder.torch.device.probe_roofs``, the
probe a ladder runs at its start: chains of dependent matmuls (the sustained rate a step's GEMMs
run at), random data, events around each timed region, median of repeats after a warm-up.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=8192)
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("device_probe needs a CUDA GPU")
    from perfladder.outputs import replace_atomically
    from perfladder.torch.device import probe_roofs      # the ladder's own probe: one method
    n = args.n
    roofs = probe_roofs(n=n, gib=4, reps=20)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    out = {
        "device": torch.cuda.get_device_name(),
        "nvidia_smi": smi,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "matmul_n": n,
        "bf16_matmul_tflops": roofs["matmul_bf16_tflops"],
        "tf32_matmul_tflops": roofs["matmul_tf32_tflops"],
        "copy_tb_per_s": roofs["copy_gbps"] / 1e3,
        "method": roofs["method"],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(Path(args.out), (json.dumps(out, indent=1) + "\n").encode())
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
