"""benchmarks/jax_bf16_anomaly.py: its HLO scatter and PTX atomic parsers, and one tiny CPU run."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _scripts import BENCHMARKS, load_script

SCRIPT = BENCHMARKS / "jax_bf16_anomaly.py"


def _module():
    return load_script("jax_bf16_anomaly")


def test_scatter_parser_reads_types_and_flags_the_embedding_gradient():
    hlo = "\n".join([
        "%fused_computation.9 (param_0: bf16[28,512], param_1: s32[65536,1]) -> bf16[28,512] {",
        "  %scatter.3 = bf16[28,512]{1,0} scatter(bf16[28,512]{1,0} %broadcast.1, "
        "s32[65536,1]{1,0} %bitcast.2, bf16[65536,512]{1,0} %convert.3), update_window_dims={1}, "
        "inserted_window_dims={0}, to_apply=%add.4",
        "  ROOT %scatter-add.7 = f32[512,28]{1,0} scatter(f32[512,28]{1,0} %b, s32[512,2]{1,0} %i, "
        "f32[512]{0} %u), to_apply=%add.5",
        "  %add.9 = f32[4]{0} add(f32[4]{0} %x, f32[4]{0} %y)",
    ])
    got = _module().scatters_in_hlo(hlo, (28, 512))
    assert [s["name"] for s in got] == ["scatter.3", "scatter-add.7"]
    emb, xent = got
    assert emb["element_types"] == ["bf16"] and emb["embedding_grad"]
    assert emb["operand_types"] == ["bf16[28,512]", "s32[65536,1]", "bf16[65536,512]"]
    assert xent["element_types"] == ["f32"] and not xent["embedding_grad"]


PTX = """
.visible .entry input_scatter_fusion(
  .param .u64 p0
)
{
  $L__BB0_1:
  atom.relaxed.sys.global.cas.b32 %r5, [%rd4], %r3, %r4;
  atom.global.cas.b32 %r6, [%rd4], %r3, %r4;
  red.global.add.u32 [%rd2], 1;
}
.visible .entry loop_add_fusion(
  .param .u64 p0
)
{
  add.f32 %f3, %f1, %f2;
}
.visible .entry scatter_fusion_2(
  .param .u64 p0
)
{
  red.relaxed.gpu.global.add.f32 [%rd7], %f4;
  atom.global.add.noftz.bf16 %rs1, [%rd8], %rs2;
}
"""


def test_ptx_parser_counts_atomics_per_kernel():
    mod = _module()
    got = mod.ptx_atomics(PTX)
    assert set(got) == {"input_scatter_fusion", "scatter_fusion_2"}        # no atomics: not listed
    assert got["input_scatter_fusion"]["cas"] == 2 and got["input_scatter_fusion"]["add.int"] == 1
    assert got["input_scatter_fusion"]["atom.relaxed.sys.global.cas.b32"] == 1
    assert got["scatter_fusion_2"]["add.f32"] == 1 and got["scatter_fusion_2"]["add.bf16"] == 1
    assert mod.classify_atomic("atom.global.add.f32") == "add.f32"
    assert mod.classify_atomic("atom.global.exch.b32") == "other"


def test_ptx_summary_and_backend_option(tmp_path):
    mod = _module()
    f = tmp_path / "module_0001.jit_train_step.ptx"
    f.write_text(PTX)
    s = mod.summarize_ptx([f])
    assert s["scatter_atomics"] == {"add.f32": 1, "add.bf16": 1, "add.bf16x2": 0, "add.f16": 0, "cas": 2}
    assert len(s["scatter_kernels"]) == 2
    assert mod.add_backend_option("", "-a") == "--xla_backend_extra_options=-a"
    assert (mod.add_backend_option("--x=1 --xla_backend_extra_options=-b", "-a")
            == "--x=1 --xla_backend_extra_options=-b,-a")
    (tmp_path / "other.txt").write_text("x")
    kept = mod.prune_dump(tmp_path)
    assert [Path(k).name for k in kept] == ["module_0001.jit_train_step.ptx.gz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["module_0001.jit_train_step.ptx.gz"]


def test_verdict_does_not_read_missing_ptx_as_no_atomics(tmp_path):
    mod = _module()
    f = tmp_path / "module_0001.jit_train_step.ptx"
    f.write_text(PTX)
    scatter = {"hlo_embedding_scatter": {"count": 1, "types": ["bf16"]},
               "jaxpr_embedding_scatter_add": {"bfloat16": 1}}
    lines = mod.verdict({"read": {**scatter, "ptx": mod.summarize_ptx([f])},
                         "none": {**scatter, "ptx": mod.summarize_ptx([])},
                         "off": {**scatter, "ptx": {"skipped": "no GPU"}}})
    assert "PTX atomics in scatter kernels {'add.f32': 1" in lines[0]
    assert lines[1].endswith("PTX atomics not read (XLA dumped no .ptx files)")
    assert lines[2].endswith("PTX not read (no GPU)")


def test_bad_arguments_are_clear_errors(tmp_path):
    env = {**os.environ, "PATH": os.environ.get("PATH", "")}
    for extra, msg in ((["--variants", "fp32,bf17"], "unknown variant(s) ['bf17']; valid choices: fp32"),
                       (["--ftz-atomics"], "no GPU found")):
        if extra == ["--ftz-atomics"] and _module()._gpu_visible():
            continue
        proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json"), *extra],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2 and msg in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
def test_smoke_run_writes_the_summary(tmp_path):
    out = tmp_path / "anomaly.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--config", "smoke", "--out", str(out),
                           "--variants", "fp32,bf16,bf16_embed_fp32,bf16_onehot,bf16_cudnn",
                           "--steps", "3", "--warmup", "1", "--window", "2"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data["variants"]) == {"fp32", "bf16", "bf16_embed_fp32", "bf16_onehot"}
    assert "cudnn" in data["skipped"]["bf16_cudnn"]                  # CPU: said, not hidden
    for name, v in data["variants"].items():
        s = v["per_step"]
        assert s["n"] == 3 and s["min_ms"] <= s["median_ms"] <= s["max_ms"]
        assert v["windowed"]["tokens_per_s"] > 0 and Path(v["hlo_file"]).is_file()
        assert v["hlo_scatters"] and all(x["element_types"] for x in v["hlo_scatters"])
        assert "no PTX" in v["ptx"]["skipped"]                        # CPU: said, not hidden
    gathers = ("fp32", "bf16", "bf16_embed_fp32")
    assert all(data["variants"][n]["hlo_embedding_scatter"]["count"] >= 1 for n in gathers)
    # what the traced program asks for, before XLA: the fix moves the scatter-add to fp32 ...
    assert data["variants"]["bf16"]["jaxpr_embedding_scatter_add"] == {"bfloat16": 1}
    assert data["variants"]["bf16_embed_fp32"]["jaxpr_embedding_scatter_add"] == {"float32": 1}
    assert data["variants"]["fp32"]["hlo_embedding_scatter_types"] == ["f32"]
    # ... and the one-hot embedding has no scatter into the table at all
    onehot = data["variants"]["bf16_onehot"]
    assert onehot["jaxpr_embedding_scatter_add"] == {} and onehot["hlo_embedding_scatter"]["count"] == 0
    assert len(data["verdict"]) >= 5 and "per-step ms" in proc.stdout
    assert "--xla_dump_to" not in data["xla_flags"]                   # CPU: no dump by default
