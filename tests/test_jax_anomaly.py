"""benchmarks/jax_bf16_anomaly.py: its HLO scatter parser, and one tiny CPU run end to end."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "jax_bf16_anomaly.py"


def _module():
    spec = importlib.util.spec_from_file_location("jax_bf16_anomaly", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


@pytest.mark.slow
def test_smoke_run_writes_the_summary(tmp_path):
    out = tmp_path / "anomaly.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--config", "smoke", "--out", str(out),
                           "--variants", "fp32,bf16,bf16_embed_fp32,bf16_cudnn",
                           "--steps", "3", "--warmup", "1", "--window", "2"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data["variants"]) == {"fp32", "bf16", "bf16_embed_fp32"}
    assert "cudnn" in data["skipped"]["bf16_cudnn"]                  # CPU: said, not hidden
    for name, v in data["variants"].items():
        s = v["per_step"]
        assert s["n"] == 3 and s["min_ms"] <= s["median_ms"] <= s["max_ms"]
        assert v["windowed"]["tokens_per_s"] > 0 and Path(v["hlo_file"]).is_file()
        assert v["hlo_scatters"] and all(x["element_types"] for x in v["hlo_scatters"])
        assert any(x["embedding_grad"] for x in v["hlo_scatters"])
    # what the traced program asks for, before XLA: the fix moves the scatter-add to fp32
    assert data["variants"]["bf16"]["jaxpr_embedding_scatter_add"] == {"bfloat16": 1}
    assert data["variants"]["bf16_embed_fp32"]["jaxpr_embedding_scatter_add"] == {"float32": 1}
    assert data["variants"]["fp32"]["hlo_embedding_scatter_types"] == ["f32"]
    assert len(data["verdict"]) >= 3 and "per-step ms" in proc.stdout
