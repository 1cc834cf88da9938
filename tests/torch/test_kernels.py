"""perfladder.torch.kernels: the smoke GPT's eager step profiled on CPU, and the CUDA-event
selection checked on stand-in profiler events (no GPU here)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import perfladder.torch as pt  # noqa: E402
from perfladder.config import get_config  # noqa: E402
from perfladder.data import TimeMachine  # noqa: E402
from perfladder.measure.timing import RecompileError  # noqa: E402
from perfladder.torch import kernels as tk  # noqa: E402
from perfladder.torch.step import make_optimizer, make_step  # noqa: E402


@pytest.fixture(scope="module")
def smoke():
    cfg = get_config("smoke")
    data = TimeMachine(cfg.batch_size, cfg.num_steps, num_train=cfg.num_train, num_val=cfg.num_val)
    torch.manual_seed(cfg.seed)
    model = pt.GPT(cfg.gpt(vocab_size=len(data.vocab)))
    step = make_step(model, make_optimizer(model, cfg.lr))
    stream = pt.batches(data, cfg.batch_size, "cpu", seed=cfg.seed)
    return step, stream, tk.kernel_breakdown(step, stream, steps=1, warmup=1)


def test_cpu_breakdown_of_the_smoke_step(smoke):
    _, _, b = smoke
    assert b.framework == "torch" and b.device == "cpu" and b.steps == 1
    assert b.num_events > 0 and b.total_us > 0 and b.wall_us > 0
    assert b.category_us["matmul"] > 0           # aten::mm / addmm
    assert b.category_us["attention"] > 0        # scaled_dot_product_attention on CPU
    assert b.category_us["reduction/norm"] > 0   # layer norm, log_softmax
    assert b.category_us["optimizer"] > 0        # AdamW's ops, inside Optimizer.step
    assert math.isclose(sum(b.category_share.values()), 1.0)
    assert [k.total_us for k in b.top] == sorted((k.total_us for k in b.top), reverse=True)
    # self CPU time does not double count nested operators: it cannot exceed the wall time
    assert b.total_us <= b.wall_us * 1.01
    assert any("CPU run" in n for n in b.notes)


def test_ops_inside_optimizer_step_count_as_optimizer(smoke):
    _, _, b = smoke
    # the single-tensor AdamW on CPU runs plain pointwise aten ops (sqrt, lerp_, ...)
    assert any("inside Optimizer.step" in n for n in b.notes)
    assert not any(k.category == "elementwise" and k.name in ("aten::lerp_", "aten::sqrt")
                   for k in b.top)


def test_recompile_while_profiling_raises(smoke, monkeypatch):
    step, stream, _ = smoke
    calls = iter(range(100))
    monkeypatch.setattr(tk, "compile_count", lambda: 3 * next(calls))
    with pytest.raises(RecompileError, match="3 compilation.*while profiling"):
        tk.kernel_breakdown(step, stream, steps=1, warmup=0)


@pytest.mark.parametrize("kw, match", [({"steps": 0}, "steps=0"), ({"warmup": -1}, "warmup=-1"),
                                       ({"top": True}, "top=True")])
def test_bad_arguments(smoke, kw, match):
    step, stream, _ = smoke
    with pytest.raises(ValueError, match=match):
        tk.kernel_breakdown(step, stream, **kw)


# -- the CUDA path, on stand-ins for torch.autograd.profiler_util.FunctionEvent -------------------
DT = torch.autograd.DeviceType


def _cpu(id_, name, parent=None, **kw):
    return SimpleNamespace(id=id_, name=name, device_type=DT.CPU, linked_correlation_id=0,
                           cpu_parent=parent, activity_type="cpu_op", **kw)


def _gpu(name, us, linked, activity="kernel", **kw):
    ev = SimpleNamespace(name=name, device_type=DT.CUDA, linked_correlation_id=linked, id=linked,
                         activity_type=activity, cpu_parent=None,
                         time_range=SimpleNamespace(elapsed_us=lambda: us), **kw)
    if "self_cuda_time_total" not in kw:
        ev.self_device_time_total = us
    return ev


def test_gpu_event_selection():
    opt = _cpu(1, "Optimizer.step#AdamW.step")
    foreach = _cpu(2, "aten::_foreach_add_", parent=opt)
    pointwise_in_opt = _cpu(3, "aten::sqrt", parent=opt)
    mm = _cpu(4, "aten::mm")
    launch = SimpleNamespace(id=99, name="cudaLaunchKernel", device_type=DT.CPU,
                             linked_correlation_id=4, cpu_parent=None, activity_type="cuda_runtime")
    events = [opt, foreach, pointwise_in_opt, mm, launch,
              _gpu("nvjet_hsh_256x128_64x4_1x2_h_bz_coopB_NTN", 100.0, 4),
              _gpu("void at::native::vectorized_elementwise_kernel<4, sqrt_kernel>", 7.0, 3),
              _gpu("void at::native::multi_tensor_apply_kernel<...>", 9.0, 2),
              _gpu("Memcpy HtoD (Pageable -> Device)", 3.0, 0, activity="gpu_memcpy"),
              _gpu("Optimizer.step#AdamW.step", 500.0, 0, activity="gpu_user_annotation"),
              _gpu("Context Sync", 800.0, 0, activity="cuda_sync"),
              # an older torch: only self_cuda_time_total, no activity_type
              _gpu("flash_fwd_kernel", 11.0, 0, self_cuda_time_total=11.0)]
    del events[-1].activity_type
    got = tk._gpu_events(events)
    assert [(n, us, c) for n, us, c in got] == [
        ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopB_NTN", 100.0, None),
        ("void at::native::vectorized_elementwise_kernel<4, sqrt_kernel>", 7.0, "optimizer"),
        ("void at::native::multi_tensor_apply_kernel<...>", 9.0, "optimizer"),
        ("Memcpy HtoD (Pageable -> Device)", 3.0, None),
        ("flash_fwd_kernel", 11.0, None)]
    b = tk.breakdown(got, steps=1, framework="torch")
    assert b.category_us == {"matmul": 100.0, "attention": 11.0, "elementwise": 0.0,
                             "reduction/norm": 0.0, "optimizer": 16.0, "memcpy/memset": 3.0,
                             "collective": 0.0, "other": 0.0}


def test_gpu_event_selection_without_activity_type():
    ann = _gpu("ProfilerStep#1", 50.0, 0, is_user_annotation=True)
    sync = _gpu("Stream Sync", 40.0, 0)
    kern = _gpu("triton_poi_fused_add_0", 5.0, 0)
    for ev in (ann, sync, kern):
        del ev.activity_type
    assert [n for n, _, _ in tk._gpu_events([ann, sync, kern])] == ["triton_poi_fused_add_0"]


def test_the_matmul_probe_times_a_chain_of_dependent_products():
    """The compute roof's timed window (``perfladder.torch.device.matmul_chain``): ``inner``
    products, each on the one before, that keep the input's magnitude when ``y`` is scaled by
    ``1/sqrt(n)`` (a bf16 chain must not overflow); the probe's method says so."""
    from perfladder.torch.device import METHOD, matmul_chain
    n, inner = 64, 10
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, n, generator=g, dtype=torch.float64)
    y = torch.randn(n, n, generator=g, dtype=torch.float64) / n ** 0.5
    assert torch.allclose(matmul_chain(x, y, inner), x @ torch.linalg.matrix_power(y, inner))
    assert torch.equal(matmul_chain(x, y, 0), x)
    out = matmul_chain(x.to(torch.bfloat16), y.to(torch.bfloat16), inner)
    assert torch.isfinite(out).all() and 0.1 < out.float().std() / x.std() < 10
    assert "chain of 10 dependent" in METHOD.format(reps=5, n=8192, gib=1, inner=10)
    # the pages tell a chain probe from a lone product by this method (kernels.ceiling.timed_as)
    from perfladder.kernels.ceiling import timed_as
    assert timed_as({"method": METHOD.format(reps=5, n=8192, gib=1, inner=10)}) == "chains"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the probe times a CUDA device")
def test_the_probe_on_a_gpu_gives_every_ceiling_from_chains():
    """On a GPU: every key, bf16 faster than TF32, a copy rate, and a method that says chains."""
    from perfladder.torch.device import probe_roofs
    roofs = probe_roofs(n=4096, gib=1, reps=5, inner=10)
    assert set(roofs) == {"matmul_bf16_tflops", "matmul_tf32_tflops", "copy_gbps", "source", "method"}
    assert roofs["matmul_bf16_tflops"] > roofs["matmul_tf32_tflops"] > 0 and roofs["copy_gbps"] > 0
    assert "a chain of 10 dependent 4096x4096 matmuls" in roofs["method"]
