"""The names a user imports (README, "The library"): each importable from where a user looks
first, and, where the code moved, from its old path too, naming the same object as its home."""
from __future__ import annotations

import importlib

import pytest

# (where a user imports it, the name, the module that defines it)
SIDE_NAMES = ("GPT", "batches", "throughput", "Recipe", "Ladder", "run_ladder", "RUNGS")
PUBLIC = [
    *[(f"perfladder.{side}", name, f"perfladder.{side}.{home}")
      for side in ("torch", "jax")
      for name, home in zip(SIDE_NAMES, ("model", "stream", "timer", "recipe", "rungs", "rungs", "rungs"))],
    ("perfladder.results", "LadderResult", "perfladder.results.record"),
    ("perfladder.results", "RungResult", "perfladder.results.record"),
    ("perfladder.results", "LearningCheck", "perfladder.measure.learning"),
    ("perfladder.results", "ResultsError", "perfladder.results.version"),
    ("perfladder.results", "SCHEMA_VERSION", "perfladder.results.version"),
    ("perfladder.config", "get_config", "perfladder.config"),
    ("perfladder.config", "pick_config", "perfladder.config"),
    ("perfladder.data", "TimeMachine", "perfladder.data"),
]
# the old paths the restructure moved, handing the same names on
MOVED = [
    ("perfladder.paths", "build_results_dir", "perfladder.book.paths"),
    ("perfladder.paths", "reference_run", "perfladder.results.committed"),
    ("perfladder.paths", "repo_root", "perfladder.results.committed"),
    ("perfladder.costmodel", "predict", "perfladder.multigpu.costmodel"),
    ("perfladder.costmodel", "get_link", "perfladder.multigpu.costmodel"),
    ("perfladder.costmodel", "scaling_curve", "perfladder.multigpu.costmodel"),
    ("perfladder.timing", "measure", "perfladder.measure.timing"),
    ("perfladder.timing", "Throughput", "perfladder.measure.timing"),
    ("perfladder.timing", "RecompileError", "perfladder.measure.timing"),
    ("perfladder.plot", "waterfall", "perfladder.pages.plot"),
    ("perfladder.plot", "compare", "perfladder.pages.plot"),
]
# names whose home is above a module that stays, which hands them on by name at first use
# (its ``__getattr__``: the parallel machinery imports nothing of the rungs' layer)
HANDED_ON = [
    *[("perfladder.torch.parallel.launch", name, "perfladder.torch.rungs.recipes")
      for name in ("fast_recipe", "recipe_for", "spec_from_args")],
    *[("perfladder.jax.parallel.measure", name, "perfladder.jax.rungs.recipes")
      for name in ("seed_recipe", "fast_recipe", "recipe_for")],
]


@pytest.mark.parametrize("where, name, home", PUBLIC + MOVED + HANDED_ON, ids=lambda v: v)
def test_a_public_name_imports_from_where_a_user_looks(where, name, home):
    assert getattr(importlib.import_module(where), name) is getattr(importlib.import_module(home), name)


@pytest.mark.parametrize("where", sorted({where for where, _, _ in HANDED_ON}))
def test_a_module_handing_names_on_refuses_a_name_it_does_not_hand_on(where):
    with pytest.raises(AttributeError, match=f"module '{where}' has no attribute 'nothing_here'"):
        importlib.import_module(where).nothing_here


@pytest.mark.parametrize("old", sorted({where for where, _, _ in MOVED}))
def test_a_moved_module_hands_on_every_public_name_of_its_new_home(old):
    """Nothing half-moved: each name an old path re-exports is its home's object."""
    module = importlib.import_module(old)
    names = [n for n in vars(module) if not n.startswith("_")]
    assert names
    for n in names:
        value = getattr(module, n)
        home = getattr(value, "__module__", None)
        if home and home.startswith("perfladder.") and home != old:
            assert getattr(importlib.import_module(home), n) is value


def test_a_results_file_reads_back_through_the_public_reader(tmp_path):
    from conftest import make_result

    from perfladder.results import LadderResult
    path = make_result("torch").write(tmp_path / "torch.json")
    assert LadderResult.read(path).framework == "torch"


def test_the_readmes_library_example_runs_as_printed(tmp_path, monkeypatch, capsys):
    """The README's ``python`` block, executed as a user would paste it (smoke config, R0)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## The library"):]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    assert re.fullmatch(r"R0: [\d,]+ tokens/s", capsys.readouterr().out.strip().splitlines()[-1])
    assert (tmp_path / "torch.json").is_file()
