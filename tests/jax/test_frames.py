"""perfladder.jax.frames: which part of the GPT an XLA op was traced from, and what that does to
the kernel report -- on a written module and on a real H100 profile of the B10 step."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

pytest.importorskip("jax")

from perfladder.config import get_config  # noqa: E402
from perfladder.jax.frames import NORM_PARTS, PART_NAMES, Frames  # noqa: E402
from perfladder.jax.kernels import sort_events  # noqa: E402
from perfladder.jax.lab import REPORT_TOP  # noqa: E402
from perfladder.jax.program import hlo_module_name, hlo_op_categories, hlo_ops  # noqa: E402
from perfladder.kernels import breakdown  # noqa: E402
from perfladder.kernels.accounting import of_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "jax_h100_b10"
RUN = ROOT / "benchmarks" / "results" / "h100-jax-again-2026-12-07" / "jax.json"
FIXTURE_B12 = ROOT / "tests" / "fixtures" / "jax_h100_b12"
RUN_B12 = ROOT / "benchmarks" / "results" / "h100-jax-b12-2026-12-07" / "jax.json"

FILES = ["/src/perfladder/jax/model.py", "/venv/flax/nnx/nn/normalization.py",
         "/venv/flax/nnx/nn/linear.py", "/venv/flax/nnx/training/optimizer.py"]
# (function, its file's number, its caller's frame; 0: none). Frame i is the i-th function:
# GPT <- Block <- LayerNorm <- _normalize; Block <- FFN <- Linear; FFN <- _gelu_bias_fwd
# (perfladder's fused GELU); Block <- CausalAttention <- rope; Optimizer.update on its own
FUNCTIONS = [("GPT.__call__", 1, 0), ("Block.__call__", 1, 1), ("LayerNorm.__call__", 2, 2),
             ("_normalize", 2, 3), ("FFN.__call__", 1, 2), ("Linear.__call__", 3, 5),
             ("_gelu_bias_fwd", 1, 5), ("CausalAttention.__call__", 1, 2), ("rope", 1, 8),
             ("Optimizer.update", 4, 0)]


def stack_tables() -> str:
    """The four tables XLA prints at the head of a module's text, for FILES and FUNCTIONS."""
    n = range(1, len(FUNCTIONS) + 1)
    lines = ["FileNames", *(f'{i} "{f}"' for i, f in enumerate(FILES, 1)), "",
             "FunctionNames", *(f'{i} "{fn}"' for i, (fn, _, _) in zip(n, FUNCTIONS)), "",
             "FileLocations",
             *(f"{i} {{file_name_id={file} function_name_id={i} line={i} end_line={i} column=1 "
               "end_column=2}" for i, (_, file, _) in zip(n, FUNCTIONS)), "",
             "StackFrames",
             *(f"{i} {{file_location_id={i} parent_frame_id={caller}}}"
               for i, (_, _, caller) in zip(n, FUNCTIONS))]
    return "\n".join(lines)


HLO = "HloModule jit__pure_step, is_scheduled=true\n\n" + stack_tables() + """


%region_0.1 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%a, %b)
}

%fused_pointwise (p0: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  ROOT %m = f32[8,8]{1,0} multiply(%p0, %p0)
}

%fused_reduce (p0.1: f32[8,8]) -> f32[8] {
  %p0.1 = f32[8,8]{1,0} parameter(0)
  %c = f32[] constant(0)
  ROOT %r = f32[8]{0} reduce(%p0.1, %c), dimensions={1}, to_apply=%region_0.1
}

%fused_copy (p0.2: f32[8,8]) -> bf16[8,8] {
  %p0.2 = f32[8,8]{1,0} parameter(0)
  ROOT %cv = bf16[8,8]{1,0} convert(%p0.2)
}

%fused_gelu_cpu (p0.3: f32[8,8]) -> bf16[8,8] {
  %p0.3 = f32[8,8]{1,0} parameter(0)
  %t = f32[8,8]{1,0} tanh(%p0.3), metadata={op_name="jit(_pure_step)/tanh" stack_frame_id=7}
  ROOT %cv.1 = bf16[8,8]{1,0} convert(%t)
}

ENTRY %main.9 (x: f32[8,8]) -> f32[8,8] {
  %x = f32[8,8]{1,0} parameter(0)
  %loop_multiply_fusion.1 = f32[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_pointwise, metadata={op_name="jit(_pure_step)/mul" stack_frame_id=4}
  %input_reduce_fusion.1 = f32[8]{0} fusion(%x), kind=kInput, calls=%fused_reduce, metadata={op_name="jit(_pure_step)/reduce_sum" stack_frame_id=4}
  %loop_convert_fusion.1 = bf16[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_copy, metadata={op_name="jit(_pure_step)/convert" stack_frame_id=3}
  %loop_add_fusion.1 = f32[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_pointwise, metadata={op_name="jit(_pure_step)/add" stack_frame_id=2}
  %loop_multiply_fusion.2 = f32[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_pointwise, metadata={op_name="jit(_pure_step)/mul" stack_frame_id=7}
  %loop_add_fusion.2 = f32[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_pointwise, metadata={op_name="jit(_pure_step)/add" stack_frame_id=6}
  %loop_multiply_fusion.3 = f32[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_pointwise, metadata={op_name="jit(_pure_step)/mul" stack_frame_id=9}
  %loop_multiply_fusion.4 = f32[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_pointwise, metadata={op_name="jit(_pure_step)/mul" stack_frame_id=10}
  %tanh_convert_fusion = bf16[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_gelu_cpu
  ROOT %loop_multiply_fusion.5 = f32[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_pointwise, metadata={op_name="jit(_pure_step)/mul"}
}
"""


def test_the_innermost_frame_that_names_a_part_decides():
    frames = Frames(HLO)
    assert [frames.part(i) for i in range(1, 11)] == [
        None, "residual add", "LayerNorm", "LayerNorm", "GELU", "linear", "GELU", "attention",
        "RoPE", None]
    assert not frames.optimizer(4) and frames.optimizer(10)
    assert [f for _, f in frames.stack(6)] == ["Linear.__call__", "FFN.__call__", "Block.__call__",
                                              "GPT.__call__"]
    assert set(NORM_PARTS) <= set(PART_NAMES)


def test_a_layernorms_and_the_residual_adds_elementwise_passes_count_with_the_reductions():
    ops = hlo_ops(HLO)
    assert ops["loop_multiply_fusion.1"] == ("reduction/norm", "LayerNorm")
    assert ops["input_reduce_fusion.1"] == ("reduction/norm", "LayerNorm")
    assert ops["loop_add_fusion.1"] == ("reduction/norm", "residual add")
    assert ops["loop_convert_fusion.1"] == ("memcpy/memset", "LayerNorm")   # a cast stays a copy
    assert ops["loop_multiply_fusion.2"] == ("elementwise", "GELU")
    assert ops["loop_add_fusion.2"] == ("elementwise", "linear")             # FC1's bias add
    assert ops["loop_multiply_fusion.3"] == ("elementwise", "RoPE")
    assert ops["loop_multiply_fusion.4"] == ("optimizer", None)
    assert ops["loop_multiply_fusion.5"] == ("elementwise", None)            # no stack: as it holds
    # XLA:CPU writes no stack on a fusion: the last op of its body that has one speaks for it
    assert ops["tanh_convert_fusion"] == ("elementwise", "GELU")
    assert hlo_op_categories(HLO) == {k: c for k, (c, _) in ops.items()}


def test_kernels_of_a_matched_fusion_are_named_with_their_part():
    events = [(("loop_multiply_fusion_2", 5.0), ("command_buffer_1", "jit__pure_step")),
              (("loop_add_fusion_1", 3.0), (None, None)),
              (("nvjet_sm90_tst_128x160", 7.0), ("command_buffer_1", "jit__pure_step")),
              (("loop_multiply_fusion_1", 2.0), ("loop_multiply_fusion.1", "jit_other"))]
    triples, matched = sort_events(events, hlo_ops(HLO), hlo_module_name(HLO))
    assert triples == [("loop_multiply_fusion_2 [GELU]", 5.0, "elementwise"),
                       ("loop_add_fusion_1 [residual add]", 3.0, "reduction/norm"),
                       ("nvjet_sm90_tst_128x160", 7.0, "matmul"),         # a library kernel: by name
                       ("loop_multiply_fusion_1", 2.0, "elementwise")]    # another module's op
    assert matched == 8.0
    by_name, none = sort_events(events, None, None)
    assert [t[0] for t in by_name] == [e[0][0] for e in events] and none == 0.0


def _sorted_profile(fixture: Path):
    """The fixture's events sorted by its module: (rows, (name, µs, category) triples, µs matched)."""
    text = gzip.open(fixture / "hlo.txt.gz", "rt").read()
    rows = json.load(gzip.open(fixture / "events.json.gz", "rt"))
    events = [((name, us), (op, mod)) for name, us, op, mod in rows]
    triples, matched = sort_events(events, hlo_ops(text), hlo_module_name(text))
    return rows, triples, matched


def _roofline(triples, run_path: Path, rung: str) -> dict:
    """The kernel report's roofline rows of a 3-step profile, for ``rung`` of the committed run."""
    kb = breakdown(triples, 3, REPORT_TOP, device="gpu", framework="jax")
    run = json.loads(run_path.read_text())
    r = next(r for r in run["rungs"] if r["name"] == rung)
    full = get_config("full")
    rl = of_run(kb, run["roofs"], full.gpt(), batch=r["batch_size"], seq=full.num_steps,
                precision="bf16", framework="jax", recipe=r["recipe"])
    return rl


@pytest.fixture(scope="module")
def h100_b10():
    return _sorted_profile(FIXTURE)


def test_on_a_real_h100_profile_every_xla_fusion_is_found_by_its_kernels_name(h100_b10):
    rows, triples, matched = h100_b10
    ops = [op for _, _, op, _ in rows if op]
    assert ops.count("command_buffer_1") > len(ops) / 2    # most events name no op of their own
    fusions = [(t, us, cat) for (t, us, cat), row in zip(triples, rows)
               if "fusion" in t.split(" ")[0] and row[3] == "jit__pure_step"]  # not the stream's
    # found: named with its part of the GPT, or the optimizer's (which is no part of it); a
    # fusion not found would keep its bare name and read as elementwise
    assert fusions and all(t.endswith("]") or cat == "optimizer" for t, _, cat in fusions)
    assert matched >= sum(us for _, us, _ in fusions)


def test_on_a_real_h100_profile_gelu_and_layernorm_land_in_their_groups(h100_b10):
    """The forward GELU fusion (XLA: ``loop_add_multiply_fusion``) is the roofline's GELU row,
    beside the Pallas backward; a LayerNorm's loop fusions and the residual adds are reductions;
    what is left as 'elementwise: rest' is less than either named sub-row."""
    rows, triples, _ = h100_b10
    for t, _, cat in triples:
        if t.endswith(("[LayerNorm]", "[residual add]")):
            assert cat in ("reduction/norm", "memcpy/memset"), t
    rows_by = {r["group"]: r for r in _roofline(triples, RUN, "B10")["rows"]}
    gelu = rows_by["elementwise: GELU"]
    assert any(k.startswith("loop_") and k.endswith("[GELU]") for k in gelu["kernels"])
    assert "gelu_bias_grad_bwd" in gelu["kernels"]
    assert rows_by["elementwise: rest"]["time_ms"] < gelu["time_ms"]
    assert rows_by["layernorm/reductions"]["time_ms"] > rows_by["elementwise: rest"]["time_ms"]


def test_the_smoke_gpts_compiled_step_names_every_part():
    """The names PARTS looks for are the model's own: the smoke GPT's compiled step (split jit,
    bf16, XLA attention) has ops of every part but the fused kernels'. A renamed function in
    perfladder/jax/model.py would fail here before a GPU run's report lost its groups."""
    import dataclasses

    from perfladder.jax.lab import JaxLab

    lab = JaxLab(get_config("smoke"), probe=False)
    recipe = dataclasses.replace(lab.seed_recipe(), jit="split", dtype="bfloat16")
    step = lab.build_step(recipe)
    X, Y = next(lab.stream(recipe.batch_size))
    found = {part for _, part in hlo_ops(step.lower(X, Y).compile().as_text()).values()}
    assert set(PART_NAMES) <= found


def test_on_a_real_h100_profile_xlas_gelu_backward_with_the_bias_sums_is_gelu():
    """B12 leaves GELU's backward to XLA, which fuses it into the reduce summing FC1's bias
    gradient (its root the Linear's reduce, most of its arithmetic GELU's derivative). Sorted
    as GELU's elementwise pass, the GELU row holds forward and backward against a floor that
    charges both, and is no accounting error."""
    _, triples, _ = _sorted_profile(FIXTURE_B12)
    # the six blocks' fusions share one kernel name; input_add_reduce_fusion_6 is another one
    backward = [(t, cat) for t, _, cat in triples if t.split(" ")[0] == "input_add_reduce_fusion"]
    assert backward and all(t.endswith("[GELU]") and cat == "elementwise" for t, cat in backward)
    rl = _roofline(triples, RUN_B12, "B12")
    rows_by = {r["group"]: r for r in rl["rows"]}
    gelu = rows_by["elementwise: GELU"]
    assert {k.split(" ")[0] for k in gelu["kernels"]} >= {"input_add_reduce_fusion",
                                                          "loop_convert_multiply_fusion_5"}
    assert not gelu["accounting_error"] and not rl["accounting_errors"]
    assert gelu["time_ms"] > gelu["floor_ms"]       # both directions' kernels, above the floor


def test_a_bias_reduce_of_linear_arithmetic_stays_a_reduction():
    """Only a reduce whose body is mostly an elementwise part's is moved: FC2's bias-gradient
    sum (a reduce of the Linear's own ops) stays with the reductions."""
    text = gzip.open(FIXTURE_B12 / "hlo.txt.gz", "rt").read()
    ops = hlo_ops(text)
    assert ops["input_reduce_fusion"] == ("reduction/norm", "linear")
    assert ops["input_add_reduce_fusion.6"] == ("reduction/norm", "linear")   # no GELU in it
    moved = {k for k, (cat, part) in ops.items() if "reduce_fusion" in k and cat == "elementwise"}
    assert moved == {f"input_add_reduce_fusion{s}" for s in ("", ".1", ".2", ".3", ".4", ".5")}
