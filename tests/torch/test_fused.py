"""perfladder.torch.fused: the cases of tests/_torch_fused_cases.py and
tests/_torch_fused_attention_cases.py.

On a CUDA GPU they are imported and run here, natively. Without one, the Triton kernels can
only run in Triton's CPU interpreter, and ``TRITON_INTERPRET=1`` must be in the environment
before triton is first imported -- which, in this test session, may already have happened
(torch.compile imports it). So the cases run once in a subprocess with that variable set,
and each case here reports its own outcome from that run's JUnit XML.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")
import torch  # noqa: E402

CASES_FILES = [Path(__file__).resolve().parents[1] / name
               for name in ("_torch_fused_cases.py", "_torch_fused_attention_cases.py")]
CASE_NAMES = [n.name for f in CASES_FILES for n in ast.parse(f.read_text()).body
              if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
assert len(set(CASE_NAMES)) == len(CASE_NAMES), "case names must be unique across the files"

if torch.cuda.is_available():
    sys.path.insert(0, str(CASES_FILES[0].parent))
    from _torch_fused_attention_cases import *  # noqa: F401,F403,E402
    from _torch_fused_cases import *  # noqa: F401,F403,E402
else:
    @pytest.fixture(scope="module")
    def interpreted_run(tmp_path_factory):
        """``{case name: [(outcome, message), ...]}`` of one interpreter run of all the cases."""
        xml = tmp_path_factory.mktemp("fused") / "cases.xml"
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
               "--junitxml", str(xml), *map(str, CASES_FILES)]
        proc = subprocess.run(cmd, cwd=CASES_FILES[0].parents[1], env=env, capture_output=True,
                              text=True, timeout=1800)
        if not xml.exists():
            pytest.fail(f"the interpreter run wrote no report (exit {proc.returncode}):\n"
                        f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        out: dict[str, list] = {}
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = case.get("name").split("[")[0]
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = tag
                    message = (el.get("message") or "") + "\n" + (el.text or "")
            out.setdefault(name, []).append((outcome, message))
        if proc.returncode not in (0, 1):           # 1: some case failed, reported per case below
            pytest.fail(f"pytest exit {proc.returncode}:\n{proc.stdout[-3000:]}")
        return out

    @pytest.mark.parametrize("case", CASE_NAMES)
    def test_fused_case_in_triton_interpreter(interpreted_run, case):
        results = interpreted_run.get(case)
        assert results, f"{case} did not run in the interpreter subprocess"
        bad = [m for o, m in results if o in ("failure", "error")]
        assert not bad, f"{case}:\n" + "\n".join(m[-4000:] for m in bad)
        if all(o == "skipped" for o, _ in results):
            pytest.skip(results[0][1].strip().splitlines()[0] if results[0][1].strip() else "skipped")


# -- the kernels compiled for an H200 (sm_90a), here on CPU ---------------------------------------
def _compile_like_jit(kernel, args: dict, consts: dict, num_warps: int, num_stages: int):
    """Compile ``kernel`` for sm_90a as Triton's JIT would for these arguments: a pointer
    (given as its type, e.g. ``'*bf16'``) is 16-byte aligned, an integer equal to 1 becomes a
    constant and one divisible by 16 is marked so (what lets loads vectorise and pipeline)."""
    import triton
    from triton.backends.compiler import GPUTarget
    sig, constexprs, attrs = {}, dict(consts), {}
    for i, name in enumerate(kernel.arg_names):
        v = args.get(name)
        if name in consts:
            sig[name] = "constexpr"
        elif isinstance(v, str):
            sig[name], attrs[(i,)] = v, [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[name] = "fp32"
        elif v == 1:
            sig[name], constexprs[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def _sm90_cases():
    """(kernel, example arguments, constexprs, launch configuration) at the model's shapes:
    B=1024, T=128, 8 heads of 64, D=512, F=2048, bf16."""
    from perfladder.torch.fused import attention as fattn
    from perfladder.torch.fused import mlp as fmlp
    B, T, H, D, F = 1024, 128, 8, 512, 2048
    scale = 0.18
    fwd = {"qkv_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "y_ptr": "*bf16", "lse_ptr": "*fp32",
           "T": T, "s_b": T * 3 * D, "s_t": 3 * D, "y_b": T * D, "y_t": D, "qk_scale": scale}
    bwd = {**fwd, "dy_ptr": "*bf16", "dqkv_ptr": "*bf16", "dy_b": T * D, "dy_t": D, "sm_scale": scale}
    attn = lambda cfg: dict(HEADS=H, HALF=32, BLOCK_T=128, BLOCK_N=cfg["block_n"], PREC="tf32", UPCAST=False)  # noqa: E731
    g = fmlp.GEMM
    ptrs = {n: "*bf16" for n in ("a_ptr", "b_ptr", "bias_ptr", "aux_ptr", "out_ptr", "out2_ptr")}
    gemm = lambda dgelu: dict(K=D, DGELU=dgelu, EVEN=True, BLOCK_M=g["block_m"], BLOCK_N=g["block_n"],  # noqa: E731
                              BLOCK_K=g["block_k"], PREC="tf32", UPCAST=False)
    fc1 = {**ptrs, "part_ptr": "*fp32", "M": B * T, "N": F, "s_am": D, "s_ak": 1, "s_bk": 1, "s_bn": D}
    dgelu = {**fc1, "s_bk": F, "s_bn": 1}
    return {
        "attention fwd": (fattn._rope_attention_fwd_kernel, fwd, attn(fattn.FWD), fattn.FWD),
        "attention bwd": (fattn._rope_attention_bwd_kernel, bwd, attn(fattn.BWD), fattn.BWD),
        "mlp fc1+gelu": (fmlp._gemm_kernel, fc1, gemm(False), g),
        "mlp fc2 dx+dgelu": (fmlp._gemm_kernel, dgelu, gemm(True), g),
    }


@pytest.mark.parametrize("which", ["attention fwd", "attention bwd", "mlp fc1+gelu", "mlp fc2 dx+dgelu"])
def test_kernel_compiles_for_sm90_without_spills(which):
    """Triton compiles to an sm_90a cubin without a GPU (its bundled ptxas): each kernel, at the
    model's shapes with its default launch configuration, builds and keeps everything in
    registers (no local-memory stack: a spill would turn the attention's register-resident dQ
    or a GEMM's accumulator into memory traffic); the GEMMs' loads are software-pipelined
    (asynchronous copies into shared memory, one buffer per stage)."""
    import triton

    from perfladder.torch.fused import attention as fattn
    if not isinstance(fattn._rope_attention_fwd_kernel, triton.runtime.jit.JITFunction):
        pytest.skip("triton was imported under TRITON_INTERPRET=1 in this process")
    kernel, args, consts, cfg = _sm90_cases()[which]
    compiled = _compile_like_jit(kernel, args, consts, cfg["num_warps"], cfg["num_stages"])
    assert compiled.asm["cubin"]
    if which.startswith("mlp"):
        assert "async_copy_global_to_local" in compiled.asm["ttgir"] and "warp_group_dot" in compiled.asm["ttgir"]
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        pytest.skip(f"no cuobjdump at {cuobjdump} to read the register use")
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"perfladder_sm90_{os.getpid()}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    try:
        usage = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True,
                               text=True, timeout=60).stdout
    finally:
        cubin.unlink()
    line = next(ln for ln in usage.splitlines() if "REG:" in ln)
    fields = dict(f.split(":") for f in line.split() if ":" in f)
    assert int(fields["STACK"]) == 0 and int(fields["LOCAL"]) == 0, line
    print(which, line)
