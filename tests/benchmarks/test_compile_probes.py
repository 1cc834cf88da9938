"""benchmarks/compile_variants.py, step_form_gate_time.py and compile_ahead_probe.py, the parts
a CPU can check without their minutes of compiling: the regional variant compiles each block in
place (what the model's parameters and names keep), a rung the results file lacks or an unknown
variant is refused in one line naming the valid ones, a variant that fails is recorded with its
reason while the others run, and the compile log is read by program. (What the ahead probe
runs, ``compile_ahead`` and ``cache_events``, is tested in tests/ahead/test_torch.py.)"""
import json
import logging
import subprocess
import sys

from _scripts import BENCHMARKS, load_script

from perfladder.config import get_config
from perfladder.torch.model import GPT


def test_regional_compile_compiles_each_block_in_place():
    regional = load_script("compile_variants")
    model = GPT(get_config("smoke").gpt(vocab_size=28))
    names = [n for n, _ in model.named_parameters()]
    assert regional.compile_blocks(model) is model
    assert all(blk._compiled_call_impl is not None for blk in model.blks)    # compiled on first call
    assert model._compiled_call_impl is None                                 # the model itself is not
    assert [n for n, _ in model.named_parameters()] == names


def variants(*args, timeout=120):
    return subprocess.run([sys.executable, str(BENCHMARKS / "compile_variants.py"), *args],
                          capture_output=True, text=True, timeout=timeout)


def test_compile_variants_refuse_a_rung_the_results_lack_and_an_unknown_variant():
    proc = variants("--rung", "B99")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line, = proc.stderr.strip().splitlines()
    assert "'B99'" in line and "valid choices: R0, R1" in line and "B14" in line
    proc = variants("--variants", "whole,fastest")
    line, = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "'fastest'" in line and "valid choices: whole, regional, graphs" in line


def test_a_variant_that_cannot_run_here_is_recorded_with_its_reason(tmp_path):
    proc = variants("--rung", "R1", "--config", "smoke", "--variants", "graphs", "--out",
                    str(tmp_path / "v.json"), timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    graphs, = json.loads((tmp_path / "v.json").read_text())["variants"]
    assert graphs["variant"] == "graphs" and "reduce-overhead" in graphs["error"] and "CUDA" in graphs["error"]


def test_the_autotune_variant_refuses_a_cpu_before_compiling():
    import pytest
    import torch
    probe = load_script("compile_variants")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: autotune would run")
    recipe = {"batch_size": 8, "compiled": True, "bf16": True}
    with pytest.raises(RuntimeError, match="autotune: .*run it on a GPU"):
        probe.one_variant("autotune", recipe, "smoke")


def test_an_inductor_setting_variant_sets_its_dotted_names():
    import torch._inductor.config as inductor_config
    probe = load_script("compile_variants")
    settings = probe.INDUCTOR_SETTINGS["no_pointwise_autotune"]
    assert settings == {"triton.autotune_pointwise": False}
    with inductor_config.patch({"triton.autotune_pointwise": True, "pattern_matcher": True}):
        probe.apply_settings(inductor_config, settings)
        assert inductor_config.triton.autotune_pointwise is False
        probe.apply_settings(inductor_config, probe.INDUCTOR_SETTINGS["no_pattern_matcher"])
        assert inductor_config.pattern_matcher is False


def test_the_gate_probe_reads_compilations_by_program():
    probe = load_script("step_form_gate_time")
    seen = probe.Compilations()
    log = logging.getLogger("test_compile_probes")
    log.addHandler(seen)
    try:
        log.warning("Finished XLA compilation of jit(train_step) in 2.5 sec")
        log.warning("Compiling jit(copy) with global shapes and types")          # not a finish line
        log.warning("Finished XLA compilation of jit(copy) in 0.01 sec")
    finally:
        log.removeHandler(seen)
    assert seen.done == [("jit(train_step)", 2.5), ("jit(copy)", 0.01)]


def test_the_compile_ahead_probe_refuses_an_unknown_rung_and_says_when_nothing_compiles(capsys, monkeypatch,
                                                                                        tmp_path):
    probe = load_script("compile_ahead_probe")
    assert probe.main(["--rungs", "R2,B99"]) == 2
    line, = capsys.readouterr().err.strip().splitlines()
    assert "B99" in line and "valid choices: R0, R1" in line
    # in this process: the probe points inductor's cache at a fresh folder, which the
    # monkeypatch gives back afterwards (R0 compiles nothing, so nothing is written there)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert probe.main(["--config", "smoke", "--rungs", "R0"]) == 0
    assert "none of R0 is a compiled step" in capsys.readouterr().out
