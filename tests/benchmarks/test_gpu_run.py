"""benchmarks/gpu_run.sh: a bad FRAMEWORKS value is one line naming it and the valid choices,
before the script touches its job folder or starts anything (the whole run on a CPU is what
its CONFIG=smoke does; it takes minutes, so it is not repeated here)."""
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_run.sh"


@pytest.mark.parametrize("value,said", [
    ("torch tensorflow", "FRAMEWORKS names 'tensorflow'; valid: torch, jax"),
    ("jax jax", "FRAMEWORKS names 'jax' twice"),
    ("  ", "FRAMEWORKS is empty; valid: torch, jax"),
])
def test_a_bad_frameworks_value_is_one_line_and_nothing_starts(tmp_path, value, said):
    out = tmp_path / "out"
    env = {**os.environ, "FRAMEWORKS": value, "PYTHON": "/nonexistent/python"}
    proc = subprocess.run(["bash", str(SCRIPT), "start", str(out)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and said in proc.stderr
    assert list(out.iterdir()) == []           # no job started: nothing written into OUT
