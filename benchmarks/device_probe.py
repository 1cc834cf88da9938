"""Measure the two ceilings of this GPU once: a large bf16 matmul and a device-to-device copy.

    python benchmarks/device_probe.py --out benchmarks/results/h200/device.json

The matmul rate is the measured compute roof a rung's rate is read against (a run's
``LadderResult.roofs``, read from this file by ``perfladder.results.committed.roofs_from_probe``);
the copy rate is the bandwidth roof. Random data, not zeros (zeros run faster on tensor
cores); events around each timed region; median of repeats; warm-up first.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
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
    dev = torch.device("cuda")
    n = args.n

    def time_ms(fn, reps=20, warm=5):
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        out = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
        return statistics.median(out), out

    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    ms, _ = time_ms(lambda: x @ y)
    bf16_tflops = 2 * n ** 3 / (ms / 1e3) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = True
    xf, yf = x.float(), y.float()
    ms32, _ = time_ms(lambda: xf @ yf)
    tf32_tflops = 2 * n ** 3 / (ms32 / 1e3) / 1e12
    src = torch.randn(1 << 30, device=dev, dtype=torch.float32)  # 4 GiB
    dst = torch.empty_like(src)
    msc, _ = time_ms(lambda: dst.copy_(src), reps=10)
    copy_tbs = 2 * src.numel() * 4 / (msc / 1e3) / 1e12
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    out = {
        "device": torch.cuda.get_device_name(),
        "nvidia_smi": smi,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "matmul_n": n,
        "bf16_matmul_tflops": bf16_tflops,
        "tf32_matmul_tflops": tf32_tflops,
        "copy_tb_per_s": copy_tbs,
        "method": "median of 20 (copy: 10) CUDA-event-timed repeats after 5 warm-ups; random data; "
                  "copy counts bytes read + written of a 4 GiB fp32 tensor",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
