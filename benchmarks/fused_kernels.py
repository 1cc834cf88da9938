"""Fused kernels vs the reference ops, kernel by kernel and in the full training step.

    python benchmarks/fused_kernels.py --framework torch --out benchmarks/results/h200-fused
    python benchmarks/fused_kernels.py --framework jax --out benchmarks/results/h200-fused --xla-flags
    python benchmarks/fused_kernels.py --framework jax --parts kernels --attention-configs --out /tmp/f --smoke

Per kernel (``kernels`` in the JSON): the reference ops (compiled: ``torch.compile`` /
``jax.jit``) and the fused kernel on the full model's shapes at the batch given (bf16),
forward alone and forward + backward, median of synced repeats, with the bytes the fused
kernel moves and the GB/s that makes. ``ffn_epilogue`` (torch, ``fused_epilogue_torch.py``): the
FFN with GELU in cuBLASLt's epilogues (B15, nvmath-python) against the compiled reference FFN.

Attention (``kernels``): ``attention`` is the fused kernel (RoPE on load, causal, one kernel
each way) against the model's compiled/jitted split + RoPE + attention, from the (B, T, 3D)
projection to (B, T, D); on a GPU also that reference under cuDNN (``attention_ref_cudnn``; torch
also flash's and cuDNN's SDPA alone on rotated q, k, v): ``fused_attention_torch.py``,
``fused_attention_jax.py``. ``--attention-configs`` (jax) times the fused forward and backward
kernels alone, B8's and B12's (the bias on load), under each launch configuration (bare:
``JAX_ATTENTION_SWEEP``; or ``fwd:BLOCK_M/BLOCK_N/WARPS/STAGES`` and
``bwd:BLOCK/INNER/WARPS/STAGES``), each checked against the default configuration's output, into
``attention_configs``, and the fastest matching one of each part into ``attention_best`` (what
the kernel module's ``FWD`` / ``BWD`` should become).

Full step (``steps``): tokens/s of each ladder's fastest configuration with and without each
fused option, from the same initial weights, gated (its first ``GATE_STEPS`` losses on fixed
batches within ``LOSS_ATOL`` of the unfused configuration's, else failing and not timed).

* torch: compiled, bf16 autocast, fused AdamW, one-hot embedding (``--embed gather``: the gather),
  CUDA graphs, the batch given; on CPU (``--smoke``) the step runs eagerly;
* jax: bf16, fp32 embedding lookup, cuDNN attention (XLA's on CPU), split/merge jit, donation.

``--xla-flags`` (jax): the unfused step once per flag (``XLA_FLAGS_TRIED``, or a list), each in a
fresh process; an unknown flag is recorded as such. ``--smoke``: the smoke config on CPU (the
Triton / Pallas interpreters), not results. Results are written after every measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

from perfladder.config import gpu_present

if not gpu_present():                    # the kernels run in Triton's interpreter on CPU, which
    os.environ.setdefault("TRITON_INTERPRET", "1")   # must be set before triton is imported

GATE_STEPS = 3
LOSS_ATOL = 2e-2          # as the beyond rungs' loss gate (perfladder.torch.rungs.beyond.LOSS_ATOL)
TORCH_CONFIGS = {"none": (), "rope": ("rope",), "addnorm": ("addnorm",), "gelu": ("gelu",),
                 "rope+addnorm": ("rope", "addnorm"), "all": ("rope", "addnorm", "gelu")}
JAX_CONFIGS = {"none": (), "addnorm": ("addnorm",)}
XLA_FLAGS_TRIED = ("--xla_gpu_enable_cudnn_layer_norm=true", "--xla_gpu_enable_triton_gemm=false",
                   "--xla_gpu_triton_gemm_any=true", "--xla_gpu_autotune_level=0")


class Results:
    """The JSON being built, rewritten after every change."""

    def __init__(self, path: Path, head: dict):
        self.path, self.data = path, {**head, "kernels": {}, "steps": {}, "errors": []}
        self.save()

    def put(self, section: str, key: str, value) -> None:
        self.data[section][key] = value
        self.save()
        print(f"[{section}] {key}: {json.dumps(value)}", flush=True)

    def error(self, what: str, e: BaseException) -> None:
        msg = f"{what}: {type(e).__name__}: {e}"[:3000]
        self.data["errors"].append({"what": what, "error": msg,
                                    "traceback": traceback.format_exc()[-3000:]})
        self.save()
        print(f"FAILED {msg}", file=sys.stderr, flush=True)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1, default=str) + "\n")


def median_ms(fn, sync, reps: int, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def kernel_row(ref_fwd, ref_all, fused_fwd, fused_all, sync, reps, nbytes) -> dict:
    """ms of the reference and the fused kernel, forward and forward+backward."""
    row = {k: median_ms(f, sync, reps) for k, f in (("ref_fwd_ms", ref_fwd), ("ref_fwd_bwd_ms", ref_all),
                                                     ("fused_fwd_ms", fused_fwd), ("fused_fwd_bwd_ms", fused_all))}
    row["fused_bytes"] = nbytes
    row["fused_fwd_bwd_gbps"] = nbytes / (row["fused_fwd_bwd_ms"] / 1e3) / 1e9
    row["speedup_fwd_bwd"] = row["ref_fwd_bwd_ms"] / row["fused_fwd_bwd_ms"]
    return row


def gate(losses: list[float], ref: list[float] | None) -> dict:
    diff = None if ref is None else max(abs(a - b) for a, b in zip(losses, ref))
    ok = diff is None or diff <= LOSS_ATOL                 # NaN fails
    return {"losses": losses, "max_abs_diff_vs_unfused": diff, "atol": LOSS_ATOL, "passed": bool(ok)}


# -- torch -----------------------------------------------------------------------------------
def run_torch(args, res: Results) -> None:
    import torch
    import torch.nn.functional as F

    from perfladder.torch import GPT
    from perfladder.torch.device import versions
    from perfladder.torch.lab import TorchLab
    from perfladder.torch.model import rope_angles, rotate
    from perfladder.torch.step import make_optimizer, make_step
    from perfladder.torch.timer import sync, throughput

    ladder = TorchLab(args.config)
    cuda = ladder.on_gpu
    dev, g, B = ladder.device, ladder.gpt_config, args.batch
    T, D, H, Dh, Fw = ladder.config.num_steps, g.num_hiddens, g.num_heads, g.head_dim, g.ffn_mult * g.num_hiddens
    res.data["versions"] = versions()
    res.data["device"] = ladder.device_name
    bf = torch.bfloat16
    cc = (lambda f: torch.compile(f)) if cuda else (lambda f: f)   # CPU smoke: eager references
    gen = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *s, dtype=bf: torch.randn(*s, device=dev, dtype=dtype, generator=gen)  # noqa: E731

    if "kernels" in args.parts:
        from perfladder.torch.fused.add_layer_norm import add_layer_norm
        from perfladder.torch.fused.gelu import gelu_tanh
        from perfladder.torch.fused.rope import rope_qkv
        N, a = B * T, 2
        try:   # RoPE: the QKV projection's output -> rotated q, k and v (B, T, H, Dh)
            cos, sin = rope_angles(T, Dh, g.rope_base, dev)
            qkv = rnd(B, T, 3 * D).requires_grad_()
            grads = [rnd(B, H, T, Dh).transpose(1, 2) for _ in range(3)]   # as SDPA's backward gives

            def ref(x):
                q, k, v = (u.reshape(B, T, H, Dh) for u in x.split(D, dim=-1))
                return rotate(q, cos, sin), rotate(k, cos, sin), v
            ref_c = cc(ref)
            fwd_bwd = lambda f: lambda: torch.autograd.grad(f(qkv), qkv, grads)  # noqa: E731
            res.put("kernels", "rope", kernel_row(
                lambda: ref_c(qkv), fwd_bwd(ref_c), lambda: rope_qkv(qkv, cos, sin, H),
                fwd_bwd(lambda x: rope_qkv(x, cos, sin, H)), sync, args.reps,
                nbytes=12 * N * D * a))            # fwd: read q,k,v, write q,k,v; bwd: same
        except Exception as e:
            res.error("kernel rope", e)
        try:   # residual add (fp32 stream + bf16 branch) + LayerNorm -> bf16, as under autocast
            x, br = rnd(B, T, D, dtype=torch.float32).requires_grad_(), rnd(B, T, D).requires_grad_()
            w = torch.ones(D, device=dev, requires_grad=True)
            b = torch.zeros(D, device=dev, requires_grad=True)
            dh, dy = rnd(B, T, D, dtype=torch.float32), rnd(B, T, D)

            def ref(x, br):
                h = x + br
                return h, F.layer_norm(h, (D,), w, b, g.ln_eps).to(bf)
            ref_c = cc(ref)
            fused = lambda x, br: add_layer_norm(x, br, w, b, g.ln_eps, bf)  # noqa: E731
            fwd_bwd = lambda f: lambda: torch.autograd.grad(f(x, br), (x, br, w, b), (dh, dy))  # noqa: E731
            res.put("kernels", "addnorm", kernel_row(
                lambda: ref_c(x, br), fwd_bwd(ref_c), lambda: fused(x, br), fwd_bwd(fused),
                sync, args.reps, nbytes=N * D * (4 + 2 + 4 + 2 + 4 + 2 + 4 + 4 + 2)))
        except Exception as e:
            res.error("kernel addnorm", e)
        try:   # tanh GELU on the FFN's hidden activation (B, T, 4D)
            hid, dgl = rnd(B, T, Fw).requires_grad_(), rnd(B, T, Fw)
            ref_c = cc(lambda h: F.gelu(h, approximate="tanh"))
            fwd_bwd = lambda f: lambda: torch.autograd.grad(f(hid), hid, dgl)  # noqa: E731
            res.put("kernels", "gelu", kernel_row(
                lambda: ref_c(hid), fwd_bwd(ref_c), lambda: gelu_tanh(hid), fwd_bwd(gelu_tanh),
                sync, args.reps, nbytes=5 * N * Fw * a))
        except Exception as e:
            res.error("kernel gelu", e)
        from fused_attention_torch import torch_attention
        torch_attention(args, res, ladder, cc, sync)
        from fused_epilogue_torch import ffn_epilogue_row
        try:   # the FFN with GELU in cuBLASLt's epilogues (B15) against the compiled reference FFN
            res.put("kernels", "ffn_epilogue", ffn_epilogue_row(g, dev, B, T, cc, sync, args.reps))
        except Exception as e:
            res.error("kernel ffn_epilogue", e)
        if cuda:
            torch.cuda.empty_cache()

    if "step" in args.parts:
        fixed = [next(ladder.stream(B)) for _ in range(GATE_STEPS)]
        ref_losses = None
        for name in args.configs:
            fused = TORCH_CONFIGS[name]
            step = None
            try:
                torch.manual_seed(ladder.config.seed)
                model = GPT(g, embed=args.embed, fused=fused).to(dev)
                # CPU smoke: an eager step (the fused kernels under torch.compile are checked by
                # tests/torch/test_fused.py and the ladder; here the script's own path runs)
                step = make_step(model, make_optimizer(model, ladder.config.lr, "fused" if cuda else "default"),
                                 compiled=cuda, bf16=True, device_type=dev.type,
                                 mode="reduce-overhead" if cuda else None)
                t0 = time.perf_counter()
                losses = torch.stack([step(X, Y) for X, Y in fixed]).float().cpu().tolist()
                first_s = time.perf_counter() - t0
                verdict = gate(losses, ref_losses)
                if name == "none":
                    ref_losses = losses
                row = {"fused": list(fused), "gate": verdict, "first_steps_s": first_s}
                if verdict["passed"]:
                    tp = throughput(step, ladder.stream(B), warmup=args.warmup, timed=args.timed,
                                    windows=args.windows)
                    row.update(tokens_per_s=tp.tokens_per_s, spread=tp.spread,
                               step_ms=1e3 * tp.step_time_s, windows=tp.windows,
                               peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None)
                res.put("steps", name, row)
            except Exception as e:
                res.error(f"step {name}", e)
            finally:
                del step
                torch._dynamo.reset()
                if cuda:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()


def run_jax(args, res: Results) -> None:
    import jax
    import jax.numpy as jnp

    from perfladder.jax.device import versions
    from perfladder.jax.fused.add_layer_norm import add_layer_norm
    from perfladder.jax.lab import JaxLab
    from perfladder.jax.recipe import Recipe
    from perfladder.jax.step import make_optimizer, make_split_step
    from perfladder.jax.timer import throughput

    ladder = JaxLab(args.config, probe=False)
    on_gpu = ladder.on_gpu
    g, B, T = ladder.gpt_config, args.batch, ladder.config.num_steps
    D = g.num_hiddens
    res.data["versions"] = versions()
    res.data["device"] = ladder.device_name
    res.data["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    sync = lambda: jax.effects_barrier()  # noqa: E731

    if "kernels" in args.parts:
        try:
            import flax.linen as linen
            bf = jnp.bfloat16
            k = jax.random.split(jax.random.key(0), 4)
            x, br = jax.random.normal(k[0], (B, T, D), bf), jax.random.normal(k[1], (B, T, D), bf)
            w, b = jnp.ones((D,), bf), jnp.zeros((D,), bf)
            cot = (jax.random.normal(k[2], (B, T, D), bf), jax.random.normal(k[3], (B, T, D), bf))
            LN = linen.LayerNorm(epsilon=g.ln_eps, dtype=bf, param_dtype=jnp.float32)

            def ref(x, br, w, b):
                h = x + br
                return h, LN.apply({"params": {"scale": w, "bias": b}}, h)

            def fused(x, br, w, b):
                return add_layer_norm(x, br, w, b, g.ln_eps)

            def fwd_bwd(f):
                return jax.jit(lambda *a: jax.vjp(f, *a)[1](cot))
            run = lambda f: lambda: jax.block_until_ready(f(x, br, w, b))  # noqa: E731
            N = B * T
            res.put("kernels", "addnorm", kernel_row(
                run(jax.jit(ref)), run(fwd_bwd(ref)), run(jax.jit(fused)), run(fwd_bwd(fused)),
                sync, args.reps, nbytes=N * D * 2 * (4 + 4)))   # fwd x,br,h,y; bwd h,dy,dh,dx
        except Exception as e:
            res.error("kernel addnorm", e)
        from fused_attention_jax import jax_attention
        jax_attention(args, res, ladder, kernel_row, median_ms)

    if "step" in args.parts:
        stream = ladder.stream(B)
        fixed = [next(stream) for _ in range(GATE_STEPS)]
        ref_losses = None
        for name in args.configs:
            try:
                model = ladder.model(Recipe(batch_size=B, dtype="bfloat16", embed_fp32=True,
                                            attn_impl="cudnn" if on_gpu else None,
                                            fused=JAX_CONFIGS[name]))
                opt = make_optimizer(model, ladder.config.lr)
                step = make_split_step(model, opt)
                t0 = time.perf_counter()
                losses = [float(step(X, Y)) for X, Y in fixed]
                first_s = time.perf_counter() - t0
                verdict = gate(losses, ref_losses)
                if name == "none":
                    ref_losses = losses
                row = {"fused": list(JAX_CONFIGS[name]), "gate": verdict, "first_steps_s": first_s}
                if verdict["passed"]:
                    tp = throughput(step, stream, warmup=args.warmup, timed=args.timed, windows=args.windows)
                    row.update(tokens_per_s=tp.tokens_per_s, spread=tp.spread,
                               step_ms=1e3 * tp.step_time_s, windows=tp.windows)
                res.put("steps", name, row)
                del step, model, opt
            except Exception as e:
                res.error(f"step {name}", e)

    if args.xla_flags:
        for flag in args.xla_flags.split(","):
            res.put("steps", f"none {flag}", xla_flag_run(args, flag))


def xla_flag_run(args, flag: str) -> dict:
    """The unfused jax step in a fresh process with ``XLA_FLAGS=flag``."""
    out = Path(args.out) / "xla_flags" / (flag.strip("-").split("=")[0] + ".json")
    cmd = [sys.executable, __file__, "--framework", "jax", "--out", str(out.parent), "--json-name", out.name,
           "--parts", "step", "--configs", "none", "--batch", str(args.batch), "--warmup", str(args.warmup),
           "--timed", str(args.timed), "--windows", str(args.windows)] + (["--smoke"] if args.smoke else [])
    env = {**os.environ, "XLA_FLAGS": flag}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.flag_timeout)
    except subprocess.TimeoutExpired:
        return {"flag": flag, "error": f"timed out after {args.flag_timeout}s"}
    text = proc.stdout + proc.stderr
    if "Unknown flag" in text or "unknown flag" in text.lower():
        return {"flag": flag, "exists": False, "error": [ln for ln in text.splitlines() if "nknown" in ln][:3]}
    try:
        row = json.loads(out.read_text())["steps"]["none"]
    except (OSError, KeyError, ValueError):
        return {"flag": flag, "exit": proc.returncode, "error": text[-1500:]}
    return {"flag": flag, "exists": True, **row}


# -- command line -------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", required=True, choices=("torch", "jax"))
    p.add_argument("--out", required=True)
    p.add_argument("--json-name", default=None)
    p.add_argument("--smoke", action="store_true", help="smoke config, CPU; numbers are not results")
    p.add_argument("--parts", default="kernels,step")
    p.add_argument("--configs", default=None, help="comma-separated step configurations (default: all)")
    p.add_argument("--batch", type=int, default=None, help="default: 2048 (full), 32 (smoke)")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--timed", type=int, default=None)
    p.add_argument("--windows", type=int, default=None)
    p.add_argument("--embed", default="onehot", choices=("onehot", "gather"),
                   help="torch: the step's embedding (GPT(embed=...))")
    p.add_argument("--xla-flags", nargs="?", const=",".join(XLA_FLAGS_TRIED), default=None,
                   help="jax: also time the unfused step under each of these XLA flags "
                        "(comma-separated; bare: XLA_FLAGS_TRIED)")
    p.add_argument("--flag-timeout", type=int, default=150)
    p.add_argument("--attention-configs", nargs="?", const="sweep", default=None,
                   help="jax: also time the attention kernels alone under each launch configuration "
                        "(comma-separated fwd:BLOCK_M/BLOCK_N/WARPS/STAGES or bwd:BLOCK/INNER/WARPS/STAGES; "
                        "bare: JAX_ATTENTION_SWEEP)")
    args = p.parse_args(argv)
    if args.attention_configs is not None:
        if args.framework != "jax":
            p.error("--attention-configs sweeps the JAX attention kernel's launch settings; "
                    "use it with --framework jax")
        from fused_attention_jax import parse_attention_configs
        try:
            args.attention_configs = parse_attention_configs(args.attention_configs)
        except ValueError as e:
            p.error(str(e))
    from perfladder.config import get_config
    args.config = get_config("smoke" if args.smoke else "full")
    table = TORCH_CONFIGS if args.framework == "torch" else JAX_CONFIGS
    args.configs = list(table) if args.configs is None else args.configs.split(",")
    bad = [c for c in args.configs if c not in table]
    if bad:
        p.error(f"--configs {bad} not valid for {args.framework}; valid choices: {list(table)}")
    args.parts = args.parts.split(",")
    if not set(args.parts) <= {"kernels", "step"}:
        p.error(f"--parts {args.parts}: valid choices: kernels, step")
    if args.attention_configs is not None and "kernels" not in args.parts:
        p.error("--attention-configs times kernels: give --parts kernels (or kernels,step)")
    defaults = dict(batch=2, reps=1, warmup=0, timed=1, windows=1) if args.smoke else \
        dict(batch=2048, reps=20, warmup=8, timed=12, windows=3)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    name = args.json_name or f"{args.framework}_fused.json"
    res = Results(Path(args.out) / name, {
        "framework": args.framework, "config": args.config.name, "batch": args.batch,
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "python": platform.python_version(), "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "timing": {k: getattr(args, k) for k in ("reps", "warmup", "timed", "windows")},
        "embed": args.embed if args.framework == "torch" else "fp32 lookup (embed_fp32=True)",
        "smoke": args.smoke})
    (run_torch if args.framework == "torch" else run_jax)(args, res)
    return 1 if res.data["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
