"""R5 in JAX with 2 OS processes on CPU, joined by jax.distributed (CPU collectives over gloo):
the processes train exactly like one device on the same global batch, and the fast form
measures, predicted first."""
import shutil

from perfladder.jax.compiler import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles (the children inherit XLA_FLAGS)
    fast_cpu_compiles()

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.jax.parallel.launch import launch_local, measure_distributed  # noqa: E402
from perfladder.jax.parallel.measure import Replica, corpus, fixed_global_batches  # noqa: E402
from perfladder.jax.rungs.recipes import recipe_for, seed_recipe  # noqa: E402
from perfladder.measure.counts import check_global_rate  # noqa: E402
from perfladder.multigpu.measurement import baseline_from_windows  # noqa: E402

pytestmark = pytest.mark.multiprocess
CFG = get_config("smoke")


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One launch of 2 processes for both tests (each launch pays every process's start and
    compiles): the seed form's 3 steps checked against one device, then the fast form measured
    (predicted first): ``(measurement, processes.json, what it printed)``."""
    out = tmp_path_factory.mktemp("jaxdist")
    base = baseline_from_windows([1000.0, 1000.0])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        m = measure_distributed(2, CFG, "fast", recipe_for(CFG, "fast", on_gpu=False), baseline=base,
                                warmup=1, timed=2, windows=2, check_steps=3,
                                check_recipe=seed_recipe(CFG), out_dir=out, timeout=300)
    return m, json.loads((out / "processes.json").read_text()), printed.getvalue()


def test_two_processes_take_the_steps_one_device_takes(launched):
    m, s, _ = launched
    assert m.status == "measured", m.reason
    got = s["check"]                                   # the seed form's, before the fast form ran
    assert got["num_processes"] == 2 and got["k"] == 2 and got["recipe"] == seed_recipe(CFG).to_dict()
    data = corpus(CFG)
    rep = Replica(CFG, seed_recipe(CFG), len(data.vocab))          # one device, the same init
    want = [float(rep.step(X, Y)) for X, Y in fixed_global_batches(data, 2 * CFG.batch_size, 3)]
    # fp32; only the order of the cross-process gradient sum differs
    assert got["losses"] == pytest.approx(want, rel=1e-5)
    assert want[2] < want[0]                                        # and the steps trained
    gate, = got["allreduce_gate"]              # process 0's device, checked before the first step
    assert gate["name"] == "all-reduce gate" and gate["passed"] and gate["detail"]["ranks"] == 2
    assert gate["values"]["grad"] < 1e-5 and gate["values"]["scale"] < 1e-5


def test_fast_form_is_predicted_then_measured(launched):
    m, s, printed = launched
    assert "predict k=2" in printed
    assert m.status == "measured", m.reason
    assert (m.mechanism, m.k, m.processes) == ("jax.distributed", 2, 2)
    assert m.recipe["dtype"] == "bfloat16" and m.recipe["jit"] == "split" and m.per_rank_batch == 4 * CFG.big_batch
    assert s["spec"]["recipe"] == m.recipe                 # measured: the fast form, not the checked one
    assert m.measured_tokens_per_s > 0 and len(m.windows) == 2 and m.bus_bw_measured > 0
    assert len(m.ranks) == 2 and m.prediction["link"] == "gloo-loopback"
    # the real per-device streams were checked distinct, and process 0's rate is the global
    # tokens over the slowest process's seconds (run() asserted both; recomputed here)
    assert len(set(s["device_batch_digests"])) == 2
    assert [(g["name"], g["passed"]) for g in s["allreduce_gate"]] == [("all-reduce gate", True)]
    tokens = 2 * m.per_rank_batch * CFG.num_steps * 2
    assert check_global_rate(m.windows, tokens, s["seconds_per_process"], what="processes")
    assert m.efficiency_vs_linear == pytest.approx(m.measured_tokens_per_s / 2000.0)


def test_a_launch_without_a_folder_leaves_none_behind_even_when_it_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(RuntimeError, match="jax.distributed with 2 processes failed"):
        launch_local(2, CFG, "seed", seed_recipe(CFG), timeout=0.01)   # killed while they start
    assert not list(tmp_path.iterdir())
