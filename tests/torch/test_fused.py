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
