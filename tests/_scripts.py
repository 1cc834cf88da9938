"""Load a script of benchmarks/ as a module, to test its functions without running it."""
import importlib.util
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str):
    """``benchmarks/<name>.py`` imported under the module name ``name`` (its main() not run)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
