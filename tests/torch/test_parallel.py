"""R5's DDP worker on CPU (gloo, 2 processes), the launcher's input checks, and the data-parallel
rungs: the prediction written before anything launches, and the measurement beside it."""
from __future__ import annotations

import argparse
import copy

import pytest
import torch

from perfladder.config import get_config
from perfladder.ladder.declared import recipe_of
from perfladder.ladder.engine import Chain, run_rung
from perfladder.measure.evidence import Timing
from perfladder.measure.timing import settles
from perfladder.results.record import LadderResult, RungResult
from perfladder.torch import RUNGS, TorchLab
from perfladder.torch.parallel import launch as ddp
from perfladder.torch.parallel import worker
from perfladder.torch.recipe import Recipe
from perfladder.torch.rungs import multigpu as mg
from perfladder.torch.rungs import recipes

CFG = get_config("smoke")
SEED = recipes.seed_recipe(CFG)


def page_parallelize(model, parallel, device):
    """A page's own cell (sent to the ranks as source): DDP as the library's wraps it."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(model)


def test_gloo_two_ranks_hold_identical_parameters_after_a_step(tmp_path):
    res = ddp.data_parallel_tokens(2, CFG, "seed", SEED, parallel="ddp", backend="gloo", check_steps=1,
                                   bench_allreduce=False, out_dir=tmp_path, timeout=300,
                                   parallelize=page_parallelize)
    r0, r1 = res["ranks"]
    assert r0["parallelize"] == r1["parallelize"] == f"{worker.PAGE_MODULE}.page_parallelize"
    assert (r0["rank"], r1["rank"], r0["world_size"]) == (0, 1, 2)
    assert r0["first_batch_digest"] != r1["first_batch_digest"]      # each rank saw its own data
    assert r0["batch_digests"] == r1["batch_digests"] and len(set(r0["batch_digests"])) == 2   # checked
    assert r0["init_digest"] == r1["init_digest"]                    # same start
    for r in (r0, r1):                       # each rank's reduced gradient is the combined batch's
        g = r["allreduce_gate"]
        assert g["name"] == "all-reduce gate" and g["passed"] and g["detail"]["ranks"] == 2
        assert g["values"]["scale"] <= g["tolerances"]["scale"] and g["values"]["grad"] < 1e-5
    assert r0["params_digest"] != r0["init_digest"]                  # and the step moved them
    p0, p1 = (torch.load(tmp_path / f"params_rank{r}.pt") for r in (0, 1))
    assert torch.equal(p0, p1)                                       # DDP kept the ranks identical


def summing_ddp(model, parallel, device):
    """The planted R5: DDP whose gradient hook sums the ranks' gradients (no division by k)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    wrapped = DDP(model)

    def allreduce_sum(state, bucket):
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])
    wrapped.register_comm_hook(None, allreduce_sum)
    return wrapped


def test_gradients_summed_where_the_mean_belongs_are_refused_by_the_allreduce_gate(tmp_path):
    with pytest.raises(RuntimeError, match="all-reduce gate|AllReduceGateError") as e:
        ddp.data_parallel_tokens(2, CFG, "seed", SEED, parallel="ddp", backend="gloo", check_steps=1,
                                 bench_allreduce=False, out_dir=tmp_path, timeout=300,
                                 parallelize=summing_ddp)
    assert "summed where the mean belongs (2 x)" in str(e.value)


def test_the_allreduce_comparison_passes_the_mean_and_refuses_the_sum():
    from perfladder.measure.allreduce import AllReduceGateError
    from perfladder.torch.parallel.allreduce import compare
    want = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    g = compare(want * (1 + 1e-7), want, precision="fp32", ranks=2, who="rank 0")
    assert g.passed and g.values["scale"] == pytest.approx(1e-7)
    for k in (2, 4):
        with pytest.raises(AllReduceGateError, match=f"summed where the mean belongs \\({k} x\\)"):
            compare(k * want, want, precision="bf16", ranks=k, who="rank 1")
    with pytest.raises(AllReduceGateError, match="0.5 x"):        # one of two ranks left out
        compare(want / 2, want, precision="bf16", ranks=2, who="rank 1")


def test_nccl_k_larger_than_devices_is_an_error():
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=f"k={n + 1} .* {n} are present"):
        ddp.data_parallel_tokens(n + 1, CFG, "seed", SEED, backend="nccl")


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bad_k(k):
    with pytest.raises(ValueError, match="k="):
        ddp.data_parallel_tokens(k, CFG, "seed", SEED, backend="gloo")


def test_bad_backend_lists_choices():
    with pytest.raises(ValueError, match="'mpi'.*nccl.*gloo"):
        ddp.data_parallel_tokens(2, CFG, "seed", SEED, backend="mpi")


def test_a_launch_runs_the_recipe_it_is_handed_and_refuses_none():
    """Which recipe a form means is the rungs' (``recipes.recipe_for``); the launcher, below
    them, asks for it and says where it comes from."""
    with pytest.raises(ValueError, match=r"recipe=None.*perfladder\.torch\.rungs\.recipes\.recipe_for"):
        ddp.make_spec(CFG, "fast", None)
    with pytest.raises(ValueError, match="'medium'"):
        ddp.make_spec(CFG, "medium", SEED)
    assert ddp.make_spec(CFG, "seed", SEED.to_dict())["recipe"] == SEED.to_dict()


def test_worker_refuses_to_run_outside_torchrun(monkeypatch, capsys):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(SystemExit):
        recipes.main(["--spec", "spec.json", "--out", "out"])
    assert "torchrun" in capsys.readouterr().err


def test_multi_gpu_rungs_are_declared_last():
    assert [n for n, r in RUNGS.items() if r.stage == "multi-gpu"] == list(RUNGS)[-3:] == ["R5", "R5x", "R5f"]
    assert RUNGS["R5"].builds_on == "R0" and RUNGS["R5x"].builds_on is None    # R5x: the fastest
    assert all(RUNGS[n].kind == "multi-gpu" for n in ("R5", "R5x", "R5f"))


def _planted_base(lab, rate=512.0, windows=None):
    """R0 as if measured at ``rate`` tokens/s (t_compute = B*T/rate for the smoke sizes), its
    verdict the settle rule's on its windows."""
    windows = windows or [rate] * 3
    lab.result.add(RungResult(name="R0", key="eager", label="eager", tokens_per_s=rate,
                              batch_size=CFG.batch_size, seq_len=CFG.num_steps,
                              timing=Timing(windows=windows, seconds=[1.0] * 3, settled=3,
                                            stable=settles(windows, 0.3), target_spread=0.3,
                                            steps_per_window=3, warmup=2)))


def test_one_device_predicts_and_says_it_measured_nothing(capsys):
    lab = TorchLab(CFG)
    _planted_base(lab)
    r5 = run_rung(RUNGS["R5"], lab, Chain(RUNGS, lab))
    printed = capsys.readouterr().out
    assert printed.index("predict k=2") < printed.index("predict k=8")   # printed before anything
    assert r5.kind == "skipped" and r5.tokens_per_s is None
    assert "at least 2" in r5.error and "not measured" in r5.error
    p = r5.prediction
    assert [q["k"] for q in p.points] == list(mg.PREDICT_KS)
    t_compute = CFG.batch_size * CFG.num_steps / 512.0
    assert all(q["t_compute_s"] == pytest.approx(t_compute) for q in p.points)
    assert p.points[0]["linear_tokens_per_s"] == pytest.approx(2 * 512.0)
    assert p.points[0]["predicted_tokens_per_s"] < p.points[0]["linear_tokens_per_s"]
    assert p.predicted_tokens_per_s == p.points[0]["predicted_tokens_per_s"]
    assert p.measured_tokens_per_s is None
    assert p.assumptions["single_gpu_source"] == "R0" and p.assumptions["link"]["name"] == "gloo-loopback"


def test_without_a_baseline_measure_launches_it_then_predicts_then_launches_the_ranks(monkeypatch, capsys):
    """``measure``'s order, its launches stubbed (the real ones, four gloo ranks after their
    baseline, are the R5 benchmark's smoke run: tests/benchmarks/test_r5.py): one rank of the
    same form and recipe, no wrapper, settled; the prediction printed from its rate; the ranks."""
    from conftest import timing_of

    from perfladder.multigpu.measurement import baseline_from_windows
    from perfladder.torch.parallel import measure as dataparallel
    launched, base = [], baseline_from_windows([500.0, 500.0])

    def launch(k, config, form, recipe, *, parallel, **kw):
        print(f"LAUNCH k={k} {parallel}", flush=True)
        launched.append((k, form, recipe, parallel, kw.get("settle", False)))
        if k == 1:
            return {"ranks": [{"baseline": base.to_dict(), "peak_mem_bytes": None}]}
        return {"timing": timing_of([1500.0, 1500.0]), "bus_bw_measured": 1e9, "nodes": 1,
                "peak_mem_bytes_per_gpu": [None] * k, "ranks": [{"device_name": "cpu"}] * k}
    monkeypatch.setattr(dataparallel, "data_parallel_tokens", launch)
    m = dataparallel.measure(4, CFG, "seed", SEED.to_dict(), backend="gloo", warmup=1, timed=2, windows=2)
    out = capsys.readouterr().out
    assert launched == [(1, "seed", SEED, "none", True), (4, "seed", SEED, "ddp", False)]
    assert out.index("LAUNCH k=1 none") < out.index("predict k=4") < out.index("LAUNCH k=4 ddp")
    assert m.status == "measured" and m.mechanism == "ddp" and (m.k, m.processes) == (4, 4)
    assert m.baseline == base.to_dict() and m.prediction["single_tokens_per_s"] == 500.0
    assert m.efficiency_vs_linear == pytest.approx(1500.0 / (4 * 500.0))


@pytest.fixture(scope="module")
def launches():
    """The ranks' launches of this module, by their arguments: both bases below give R5 the
    same launch (the base prices the prediction and the efficiency, not the ranks), so the
    second reads a copy of the first's instead of starting the same two processes again."""
    return {}


@pytest.mark.parametrize("windows, settled", [(None, True), ([400.0, 512.0, 620.0], False)])
def test_ddp_rung_predicts_then_measures_with_two_cpu_ranks(monkeypatch, capsys, launches, windows, settled):
    """R5's whole path -- prediction, launch, aggregation into a RungResult -- with two gloo
    ranks on CPU standing in for two GPUs; a base that did not settle gives no efficiency."""
    real_launch = mg.dataparallel.data_parallel_tokens

    def launch_once(*args, **kw):
        key = repr((args, sorted(kw.items())))
        if key not in launches:
            launches[key] = real_launch(*args, **kw)
        return copy.deepcopy(launches[key])
    monkeypatch.setattr(mg.dataparallel, "data_parallel_tokens", launch_once)
    lab = TorchLab(CFG)
    _planted_base(lab, windows=windows)
    lab.on_gpu, lab.capability = True, (9, 0)           # pretend: two H200-class devices ...
    monkeypatch.setattr(mg.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(mg.dataparallel.costmodel, "gpu_topology",        # ... joined by NVLink ...
                        lambda: "GPU0\t X \tNV18\nGPU1\tNV18\t X \n")
    monkeypatch.setattr(lab, "reset_memory", lambda: None)
    real, launched = mg.dataparallel.measure, []

    def on_cpu(k, config, form, recipe, **kw):          # ... that are two CPU processes
        assert "R5 torch predict k=8" in capsys.readouterr().out        # predicted before launch
        launched.append((k, form, kw["parallel"], kw["link"]))
        return real(k, config, form, recipe, backend="gloo", timeout=300,
                    **{n: v for n, v in kw.items() if n != "link"}, link="gloo-loopback")
    monkeypatch.setattr(mg.dataparallel, "measure", on_cpu)
    r5 = run_rung(RUNGS["R5"], lab, Chain(RUNGS, lab))
    assert launched == [(2, "seed", "ddp", "nvlink4-h200")] and len(launches) == 1
    assert r5.kind == "multi-gpu" and r5.tokens_per_s > 0 and r5.details["mechanism"] == "DDP x2", r5.error
    assert len(r5.windows) == CFG.windows and isinstance(r5.stable, bool)
    t = r5.timing                       # the windows the ranks timed, with their own seconds
    assert len(t.seconds) == CFG.windows and all(s > 0 for s in t.seconds) and t.seconds != [1.0] * CFG.windows
    assert t.steps_per_window == CFG.timed and t.batch_shape == [CFG.batch_size, CFG.num_steps]
    assert t.stable == settles(t.windows, CFG.target_spread)         # the ladder's settle rule
    assert r5.prediction.measured_tokens_per_s == r5.tokens_per_s
    d = r5.details
    assert d["k"] == 2 and d["per_rank_batch"] == CFG.batch_size and d["bus_bw_measured"] > 0
    if settled:
        assert d["efficiency_vs_linear"] == pytest.approx(r5.tokens_per_s / (2 * 512.0))
    else:
        assert d["efficiency_vs_linear"] is None and "did not settle" in d["efficiency_note"]
    assert r5.precision == "tf32" and r5.batch_size == CFG.batch_size


def test_the_fast_form_carries_what_ddp_can_and_says_what_it_cannot():
    r = Recipe(batch_size=8, compiled=True, bf16=True, cudagraphs=True, optimizer="fused",
               embed="onehot", fused=("rope",))
    ranked, dropped = ddp.rank_recipe(r)
    d = ranked.to_dict()                                # what crosses the process boundary
    assert d["fused"] == ["rope"] and d["optimizer"] == "fused" and d["embed"] == "onehot"
    assert d["mode"] is None and dropped == ["cudagraphs"]


def test_the_fast_form_is_the_fastest_configuration_not_a_list():
    """Without a ladder, the configuration the rung declarations walk to on the device (as a rank
    runs it: no CUDA graphs); with one, the rung it kept last; the seed form is what R5 builds on."""
    walked = recipes.fast_recipe(CFG, on_gpu=False)
    assert walked == Recipe(batch_size=4 * CFG.big_batch, compiled=True, bf16=True, optimizer="fused",
                            embed="onehot", residual="bf16")
    on_gpu = recipes.fast_recipe(CFG, on_gpu=True)
    # the fused attention and FFN kernels replace the fused RoPE and GELU they subsume
    assert set(on_gpu.fused) == {"attention", "mlp", "addnorm"} and not on_gpu.cudagraphs
    ran = LadderResult(framework="torch", device="cpu", config=CFG.to_dict(), baseline="R0")
    kept = walked.replace(batch_size=CFG.big_batch, embed="gather")
    for name, key, recipe, was_kept in (("B1", "fused_adamw", kept, True), ("B4", "onehot_embedding", walked, False)):
        ran.add(RungResult(name=name, key=key, label=key, tokens_per_s=100.0, stage="beyond",
                           kept=was_kept, recipe=recipe.to_dict()))
    assert recipes.fast_recipe(CFG, ran) == kept
    with pytest.raises(ValueError, match="'jax' result"):
        recipes.fast_recipe(CFG, LadderResult(framework="jax", device="cpu", config={}, baseline="R1"))
    assert recipes.recipe_for(CFG, "seed") == recipe_of(RUNGS, RUNGS["R5"].builds_on, Recipe.seed(CFG), CFG)
    assert recipes.recipe_for(CFG, "fast", kept.to_dict()) == kept        # across a process boundary


def test_rank_cli_sets_switches_on_the_fast_form():
    args = argparse.Namespace(config="smoke", form="fast", ladder=None, batch=16, optimizer="default",
                              embed=None, mode="reduce-overhead", no_compile=False, parallel="ddp",
                              backend="gloo", warmup=None, timed=None, windows=None)
    r = Recipe.from_dict(recipes.spec_from_args(args)["recipe"])
    assert (r.batch_size, r.optimizer, r.embed, r.mode) == (16, "default", "onehot", "reduce-overhead")
    args.mode, args.no_compile = None, True
    assert not Recipe.from_dict(recipes.spec_from_args(args)["recipe"]).compiled
    with pytest.raises(SystemExit, match="--batch applies to --form fast"):
        recipes.spec_from_args(argparse.Namespace(**{**vars(args), "form": "seed", "no_compile": False}))


def test_a_rank_runs_the_parallelize_it_is_sent_and_the_librarys_otherwise():
    """The page's function travels as source and is what the rank calls (here one that wraps
    nothing, so the step trains the bare GPT); the library's own is not sent."""
    def no_wrap(model, parallel, device):
        return model
    cpu = torch.device("cpu")
    spec = ddp.make_spec(CFG, "seed", SEED, parallel="ddp", backend="gloo", parallelize=no_wrap)
    assert spec["parallelize"]["name"] == "no_wrap" and "return model" in spec["parallelize"]["source"]
    wrap = worker.technique(spec["parallelize"])
    model, step, _, _ = worker.build(spec, cpu, 0, wrap)
    assert worker.technique_name(wrap) == f"{worker.PAGE_MODULE}.no_wrap" and step.model is model
    lib = ddp.make_spec(CFG, "seed", SEED, parallel="none", backend="gloo",
                        parallelize=TorchLab(CFG).code["parallelize"])
    assert lib["parallelize"] is None
    assert worker.technique_name(worker.technique(lib["parallelize"])) == \
        "perfladder.torch.parallel.worker.parallelize"


@pytest.mark.parametrize("fn", [lambda m, p, d: m, print])
def test_a_parallelize_without_source_is_refused_in_one_line(fn):
    with pytest.raises(ValueError, match="cannot be sent to the ranks: give a function defined with def"):
        ddp.make_spec(CFG, "seed", SEED, parallelize=fn)
