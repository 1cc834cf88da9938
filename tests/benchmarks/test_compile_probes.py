"""benchmarks/compile_ahead_probe.py, the part a CPU can check without its minutes of compiling:
an unknown rung is refused in one line naming the valid ones, and a rung that compiles nothing
says so. (What the probe runs, ``compile_ahead`` and ``cache_events``, is tested in
tests/ahead/test_torch.py.)"""

from _scripts import load_script


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
