"""Inductor's settings for the smoke ladder's compiles: scalar C++ kernels on a CPU, a user's
own value kept, said in the results' notes. Each case runs in a fresh process: inductor picks
its vector instruction set once per process, at the first compile."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from perfladder.torch.compiler import VEC_ISA_ENV

SRC = str(Path(__file__).resolve().parents[2] / "src")

PROBE = """
import json, os, sys
import torch
from perfladder.torch.compiler import VEC_ISA_ENV, fast_cpu_compiles
out = {"took": fast_cpu_compiles(), "env": os.environ.get(VEC_ISA_ENV)}
from torch._inductor.cpu_vec_isa import pick_vec_isa
out["simd"] = bool(pick_vec_isa())          # inductor's own choice: SIMD kernels or scalar ones
if sys.argv[1] == "compile":                # and the kernels it then writes
    from torch._inductor.utils import run_and_get_code
    _, code = run_and_get_code(torch.compile(lambda t: torch.nn.functional.gelu(t).sum(-1)), torch.randn(64, 64))
    out["vectorized"] = "Vectorized" in "\\n".join(code)
from perfladder.config import get_config
from perfladder.torch.lab import TorchLab
out["noted"] = any("scalar, not vectorised" in n for n in TorchLab(get_config("smoke"), probe=False).result.notes)
print(json.dumps(out))
"""


def probe(env_value: str | None, compile: bool = True) -> dict:
    """What a fresh process that calls ``fast_cpu_compiles`` with ``$TORCHINDUCTOR_VEC_ISA_OK``
    at ``env_value`` (None: unset) reports; ``compile``: also compile a kernel and say whether
    its code is vectorised (a cold vectorised compile took twice the scalar one's CPU time in
    the suite: 15 CPU-seconds against 7)."""
    env = {k: v for k, v in os.environ.items() if k not in (VEC_ISA_ENV, "CUDA_VISIBLE_DEVICES")}
    env.update(PYTHONPATH=SRC, CUDA_VISIBLE_DEVICES="")       # a CPU lab, also on a GPU machine
    if env_value is not None:
        env[VEC_ISA_ENV] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE, "compile" if compile else "ask"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_fast_cpu_compiles_writes_scalar_kernels_and_tells_the_processes_it_starts():
    # scalar, in the environment its child processes inherit, and noted by a smoke lab
    assert probe(None) == {"took": True, "env": "0", "simd": False, "vectorized": False, "noted": True}


def test_a_users_own_setting_wins():
    # and with it inductor's choice of SIMD kernels (the choice the test above sees scalar
    # kernels follow; compiling the vectorised ones too adds nothing of ours)
    assert probe("1", compile=False) == {"took": False, "env": "1", "simd": True, "noted": False}
