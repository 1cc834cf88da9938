"""perfladder.torch.fused: the cases of tests/_torch_fused_cases.py.

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

CASES_FILE = Path(__file__).resolve().parents[1] / "_torch_fused_cases.py"
CASE_NAMES = [n.name for n in ast.parse(CASES_FILE.read_text()).body
              if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]

if torch.cuda.is_available():
    sys.path.insert(0, str(CASES_FILE.parent))
    from _torch_fused_cases import *  # noqa: F401,F403,E402
else:
    @pytest.fixture(scope="module")
    def interpreted_run(tmp_path_factory):
        """``{case name: [(outcome, message), ...]}`` of one interpreter run of all the cases."""
        xml = tmp_path_factory.mktemp("fused") / "cases.xml"
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
               "--junitxml", str(xml), str(CASES_FILE)]
        proc = subprocess.run(cmd, cwd=CASES_FILE.parents[1], env=env, capture_output=True,
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


# -- the attention kernels compiled for an H200 (sm_90a), here on CPU -------------------------
def _signature(kernel, dtype: str, consts: dict) -> dict:
    """Triton signature of ``kernel``: pointers of ``dtype`` (the lse/cos/sin ones fp32), int32
    sizes and strides, fp32 scales, the constexprs."""
    sig = {}
    for name in kernel.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*fp32" if name in ("lse_ptr", "cos_ptr", "sin_ptr") else f"*{dtype}"
        else:
            sig[name] = "fp32" if name.endswith("scale") else "i32"
    return sig


@pytest.mark.parametrize("which", ["fwd", "bwd"])
def test_attention_kernel_compiles_for_sm90_without_spills(which):
    """Triton compiles to an sm_90a cubin without a GPU (its bundled ptxas): the fused attention
    kernels at the model's shapes (T=128, 8 heads of 64, bf16) with the default launch
    configuration build, and keep everything in registers (no local-memory stack: a spill
    would turn the register-resident dQ accumulator into memory traffic)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from perfladder.torch.fused import attention as fattn
    kernel = fattn._fwd_kernel if which == "fwd" else fattn._bwd_kernel
    if not isinstance(kernel, triton.runtime.jit.JITFunction):
        pytest.skip("triton was imported under TRITON_INTERPRET=1 in this process")
    cfg = fattn.FWD if which == "fwd" else fattn.BWD
    consts = dict(HEADS=8, HALF=32, BLOCK_T=128, BLOCK_N=cfg["block_n"], PREC="tf32", UPCAST=False)
    src = triton.compiler.ASTSource(fn=kernel, signature=_signature(kernel, "bf16", consts),
                                    constexprs=consts)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
    assert compiled.asm["cubin"]
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        pytest.skip(f"no cuobjdump at {cuobjdump} to read the register use")
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"perfladder_attn_{which}_{os.getpid()}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    try:
        usage = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True,
                               text=True, timeout=60).stdout
    finally:
        cubin.unlink()
    line = next(ln for ln in usage.splitlines() if "REG:" in ln)
    fields = dict(f.split(":") for f in line.split() if ":" in f)
    assert int(fields["STACK"]) == 0 and int(fields["LOCAL"]) == 0, line
