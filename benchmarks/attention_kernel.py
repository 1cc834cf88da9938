"""Issue 21's attention kernel and bf16 residual stream on one GPU, in one command.

    python benchmarks/attention_kernel.py --out benchmarks/results/h200-attention/attention.json
    python benchmarks/attention_kernel.py --smoke --out /tmp/attention.json    # CPU, interpreters

Runs the PyTorch part, then the JAX part, each in its own process (one framework on the GPU at
a time; a crash in one is reported, the other still runs), under one time budget
(``--budget-s``, default 230 s: whatever does not fit is reported as skipped), then prints a
short table and writes the merged JSON to ``--out`` (each part's JSON is rewritten after every
measurement, so a part that dies keeps what it measured).

Per framework, in this order:

1. correctness on the device first: the fused kernel's forward and d(qkv) against float64 (torch)
   / fp32 at HIGHEST precision (jax), next to the reference attention's own error; and at the
   full batch against the reference (catches indexing that only large batches reach);
2. kernels, bf16, B=1024, T=128, 8 heads of 64 (``--batch``): forward and forward+backward ms
   of the fused kernel (its default launch configuration; a few others at the end, when the
   budget allows -- the best measured is reported, each one's row kept)
   and of the references -- torch: the model's ops compiled (inductor's RoPE, SDPA pinned to
   flash or cuDNN, the concat in the backward) and today's layout (the fused RoPE kernel +
   cuDNN SDPA); jax: the model's ops jitted with ``jax.nn.dot_product_attention(implementation=
   'cudnn')``;
3. the training step at the batch given, bf16, from the same weights, gated (its first 3 losses
   within 2e-2 of the base configuration's) and timed: torch compiled (CUDA graphs), fused
   AdamW, one-hot embedding; jax split jit with donation, fp32 embedding lookup.

4. the other launch configurations of the fused kernel (``--no-sweep``: none).

A kernel that fails to compile or to match is recorded as failed (with its error) and the run
goes on. ``--smoke``: the smoke config on CPU through Triton's and Pallas's interpreters (eager
torch steps and references, one gate step); its numbers are not results.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fused_kernels import GATE_STEPS, Results, gate, median_ms  # noqa: E402  (sets TRITON_INTERPRET on CPU)

TORCH_STEPS = {   # name: GPT keywords; the first is the base the others are gated against
    "base": dict(fused=("rope", "gelu")),                        # today's fastest kernels (B9)
    "attention+bf16res": dict(fused=("gelu", "attention"), residual="bf16"),
    "attention": dict(fused=("gelu", "attention")),
    "bf16res": dict(fused=("rope", "gelu"), residual="bf16"),
    "all+bf16res": dict(fused=("addnorm", "gelu", "attention"), residual="bf16"),
}
TORCH_DEFAULT = ("base", "attention+bf16res", "attention", "bf16res")
# launch configurations tried after the default (keys per step, warps, stages)
TORCH_FWD_SWEEP = [dict(block_n=32, num_warps=8, num_stages=1), dict(block_n=64, num_warps=4, num_stages=1),
                   dict(block_n=128, num_warps=8, num_stages=1)]
TORCH_BWD_SWEEP = [dict(block_n=64, num_warps=8, num_stages=1), dict(block_n=128, num_warps=8, num_stages=1)]
STEP_COST_S = {"torch": 60, "jax": 40}   # a step configuration's compile + gate + timing on a GPU
CHECK_BATCH = 64          # sequences in the float64 correctness check


class Budgeted(Results):
    """``Results`` with a deadline: what would start too late is recorded as skipped."""

    def __init__(self, path: Path, head: dict, deadline: float | None):
        super().__init__(path, head)
        self.deadline = deadline
        self.data.update(checks={}, fused_configs={}, skipped=[])
        self.save()

    def time_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.time()

    def skip(self, what: str) -> None:
        self.data["skipped"].append(what)
        self.save()
        print(f"SKIPPED {what}: past the time budget", file=sys.stderr, flush=True)


def rel(a, b) -> float:
    """||a - b|| / ||b|| in float64 (the model gate's metric)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def best_of(res, rows: dict) -> None:
    """The fused kernel's row in ``kernels``: the fastest forward among the configurations that
    matched, and the fastest measured forward+backward (each with its configurations)."""
    good = [r for r in rows.values() if r["matches_reference"]]
    if good:
        f, fb = min(good, key=lambda r: r["fwd_ms"]), min(good, key=lambda r: r["fwd_bwd_ms"])
        res.put("kernels", "fused", {"fwd_ms": f["fwd_ms"], "fwd_config": f["fwd"],
                                     "fwd_bwd_ms": fb["fwd_bwd_ms"], "fwd_bwd_configs": [fb["fwd"], fb["bwd"]],
                                     "default": rows.get("default"), "configs_tried": len(rows)})


def attention_bytes(B: int, T: int, D: int, H: int, a: int = 2) -> tuple[int, int]:
    """What the fused kernels must move: forward reads qkv, writes y and the logsumexp;
    backward reads qkv, y, dy and the logsumexp, writes d(qkv)."""
    qkv, y, lse = B * T * 3 * D * a, B * T * D * a, B * H * T * 4
    return qkv + y + lse, 2 * qkv + 2 * y + lse


# -- torch --------------------------------------------------------------------------------------
def run_torch(args, res: Results) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from perfladder.data import TimeMachine
    from perfladder.torch import GPT, batches
    from perfladder.torch.fused import attention as fattn
    from perfladder.torch.fused._launch import bf16_round_to_nearest
    from perfladder.torch.fused.rope import rope_qkv
    from perfladder.torch.model import rope_angles, rotate
    from perfladder.torch.step import make_optimizer, make_step
    from perfladder.torch.timer import sync, throughput, versions

    cfg = args.config
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    res.data.update(versions=versions(), device=torch.cuda.get_device_name(0) if cuda else "cpu")
    data = TimeMachine(cfg.batch_size, cfg.num_steps, num_train=cfg.num_train, num_val=cfg.num_val)
    g = cfg.gpt(vocab_size=len(data.vocab))
    B, T, D, H, Dh = args.batch, cfg.num_steps, g.num_hiddens, g.num_heads, g.head_dim
    bf = torch.bfloat16
    cos, sin = rope_angles(T, Dh, g.rope_base, dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    qkv = (2 * torch.randn(B, T, 3 * D, device=dev, generator=gen)).to(bf).requires_grad_()
    dy = torch.randn(B, T, D, device=dev, generator=gen).to(bf)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION} if cuda \
        else {"math": SDPBackend.MATH}

    def reference(backend, rope_kernel=False):
        def f(x):                                                  # x (B, T, 3D)
            b, t = x.shape[:2]
            if rope_kernel:
                q, k, v = rope_qkv(x, cos, sin, H)                 # (b, t, H, Dh) each
            else:
                q, k, v = (u.reshape(b, t, H, Dh) for u in x.split(D, dim=-1))
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            q, k, v = (u.transpose(1, 2) for u in (q, k, v))       # (b, H, t, Dh)
            with sdpa_kernel(backend):
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                     scale=Dh ** -0.5)
            return y.transpose(1, 2).reshape(b, t, D)              # (b, t, D)
        return f

    fused = lambda x: fattn.rope_attention(x, cos, sin, H)  # noqa: E731
    fwd_bytes, bwd_bytes = attention_bytes(B, T, D, H)
    res.data["shapes"] = dict(B=B, T=T, D=D, H=H, Dh=Dh, dtype="bfloat16")
    res.data["fused_bytes"] = {"fwd": fwd_bytes, "bwd": bwd_bytes}

    def timings(f) -> dict:
        def fb():
            torch.autograd.grad(f(qkv), qkv, dy)
        out = {"fwd_ms": median_ms(lambda: f(qkv), sync, args.reps, args.warm),
               "fwd_bwd_ms": median_ms(fb, sync, args.reps, args.warm)}
        out["bwd_ms"] = out["fwd_bwd_ms"] - out["fwd_ms"]
        return out

    # 1. correctness: float64 on a slice of the batch, and the whole batch against the reference
    ref_name = next(iter(backends))
    ref = reference(backends[ref_name])
    try:
        x = qkv.detach()[:CHECK_BATCH].clone().requires_grad_()
        x64 = x.detach().double().requires_grad_()
        xr = x.detach().clone().requires_grad_()
        g64 = dy[:CHECK_BATCH]
        c64, s64 = cos.double(), sin.double()

        def exact_f(u):            # the model's ops in float64 (the rotation fp32 inside, as defined)
            b, t = u.shape[:2]
            q, k, v = (w.reshape(b, t, H, Dh) for w in u.split(D, dim=-1))
            q, k = rotate(q, c64, s64), rotate(k, c64, s64)
            q, k, v = (w.transpose(1, 2) for w in (q, k, v))
            with sdpa_kernel(SDPBackend.MATH):                     # float64: the math kernel
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                     scale=Dh ** -0.5)
            return y.transpose(1, 2).reshape(b, t, D)
        exact = exact_f(x64)
        exact.backward(g64.double())
        with bf16_round_to_nearest():              # CPU: the interpreter rounds as a GPU does
            yf = fused(x)
            yf.backward(g64)
        yr = ref(xr)
        yr.backward(g64)
        check = {"fused_fwd_rel": rel(yf, exact), "fused_bwd_rel": rel(x.grad, x64.grad),
                 f"{ref_name}_fwd_rel": rel(yr, exact), f"{ref_name}_bwd_rel": rel(xr.grad, x64.grad)}
        yf, yr = fused(qkv), ref(qkv)                              # the whole batch
        gf, gr = (torch.autograd.grad(y, qkv, dy)[0] for y in (yf, yr))
        check.update(full_batch_fwd_rel_vs_ref=rel(yf, yr), full_batch_bwd_rel_vs_ref=rel(gf, gr))
        check["passed"] = bool(check["fused_fwd_rel"] <= 1.5 * check[f"{ref_name}_fwd_rel"] + 1e-3
                               and check["fused_bwd_rel"] <= 1.5 * check[f"{ref_name}_bwd_rel"] + 1e-3
                               and check["full_batch_fwd_rel_vs_ref"] < 0.05
                               and check["full_batch_bwd_rel_vs_ref"] < 0.05)
        res.put("checks", "attention", check)
    except Exception as e:
        res.error("check attention", e)

    # 2. kernels
    cc = (lambda f: torch.compile(f)) if cuda else (lambda f: f)    # CPU smoke: eager references
    refs = {f"inductor_rope+{n}": (lambda b=b: cc(reference(b))) for n, b in backends.items()}
    last = list(backends)[-1]
    refs[f"rope_kernel+{last}"] = lambda: reference(backends[last], rope_kernel=True)
    for name, make in refs.items():
        try:
            res.put("kernels", name, timings(make()))
        except Exception as e:
            res.error(f"kernel {name}", e)
    default_fwd, default_bwd = dict(fattn.FWD), dict(fattn.BWD)
    rows = {}

    def try_configs(tried) -> None:
        """Time the fused kernels under each (label, forward config, backward config), each
        checked against the reference at the full batch first."""
        for label, fcfg, bcfg in tried:
            if res.time_left() < 20:
                res.skip(f"kernel fused {label}")
                continue
            fattn.FWD.update(fcfg)
            fattn.BWD.update(bcfg)
            try:
                y = fused(qkv)
                gq = torch.autograd.grad(y, qkv, dy)[0]            # compiles both kernels
                ok = rel(y, ref(qkv)) < 0.05 and rel(gq, torch.autograd.grad(ref(qkv), qkv, dy)[0]) < 0.05
                row = {"fwd": dict(fcfg), "bwd": dict(bcfg), "matches_reference": ok, **timings(fused)}
                row["fwd_gbps"] = fwd_bytes / row["fwd_ms"] / 1e6
                row["bwd_gbps"] = bwd_bytes / max(row["bwd_ms"], 1e-9) / 1e6
                rows[label] = row
                res.put("fused_configs", label, row)
            except Exception as e:
                res.error(f"kernel fused {label}", e)
            finally:
                fattn.FWD.update(default_fwd)
                fattn.BWD.update(default_bwd)
        best_of(res, rows)

    try_configs([("default", default_fwd, default_bwd)])
    if cuda:
        torch.cuda.empty_cache()

    # 3. training steps
    stream = batches(data, B, dev, seed=cfg.seed + 1)
    fixed = [next(stream) for _ in range(args.gate_steps)]
    ref_losses = None
    for name in args.torch_configs:
        if res.time_left() < (STEP_COST_S["torch"] if cuda else 5):
            res.skip(f"step {name}")
            continue
        step = None
        try:
            torch.manual_seed(cfg.seed)
            model = GPT(g, embed="onehot", **TORCH_STEPS[name]).to(dev)
            step = make_step(model, make_optimizer(model, cfg.lr, "fused" if cuda else "default"),
                             compiled=cuda, bf16=True, device_type=dev.type,
                             mode="reduce-overhead" if cuda else None)
            t0 = time.perf_counter()
            losses = torch.stack([step(X, Y) for X, Y in fixed]).float().cpu().tolist()
            verdict = gate(losses, ref_losses)
            if ref_losses is None:
                ref_losses = losses
            row = {**{k: list(v) if isinstance(v, tuple) else v for k, v in TORCH_STEPS[name].items()},
                   "gate": verdict, "first_steps_s": time.perf_counter() - t0}
            if verdict["passed"]:
                tp = throughput(step, stream, warmup=args.warmup, timed=args.timed, windows=args.windows)
                row.update(tokens_per_s=tp.tokens_per_s, spread=tp.spread, step_ms=1e3 * tp.step_time_s)
            res.put("steps", name, row)
        except Exception as e:
            res.error(f"step {name}", e)
        finally:
            del step
            torch._dynamo.reset()
            if cuda:
                torch.cuda.empty_cache()

    # 4. the other launch configurations, when there is time
    if not args.no_sweep:
        try_configs([(f"fwd {c}", c, default_bwd) for c in TORCH_FWD_SWEEP]
                    + [(f"bwd {c}", default_fwd, c) for c in TORCH_BWD_SWEEP])


# -- the driver ---------------------------------------------------------------------------------
def child(args) -> int:
    res = Budgeted(Path(args.out), {"framework": args.part, "config": args.config.name,
                                    "batch": args.batch, "smoke": args.smoke}, args.deadline)
    if args.part == "torch":
        run_torch(args, res)
    else:
        from attention_kernel_jax import run_jax
        run_jax(args, res)
    return 0


def table(merged: dict) -> str:
    """The short table: checks, kernels (ms; x: the fastest reference's ms over this one's),
    steps (ms, tokens/s; x: over the first configuration's tokens/s), failures, skips."""
    nan = float("nan")
    lines = [f"{'part':<6} {'what':<28} {'fwd ms':>8} {'f+b ms':>8} {'tokens/s':>11} {'x':>6}  note"]
    for fw, part in merged["parts"].items():
        for name, c in part.get("checks", {}).items():
            lines.append(f"{fw:<6} {'check ' + name:<28} {'':>8} {'':>8} {'':>11} {'':>6}  "
                         f"{'ok' if c.get('passed') else 'FAILED'}: rel err fwd {c.get('fused_fwd_rel', nan):.1e}, "
                         f"bwd {c.get('fused_bwd_rel', nan):.1e} (reference's own: see JSON)")
        kernels = part.get("kernels", {})
        refs = [r["fwd_bwd_ms"] for n, r in kernels.items() if n != "fused"]
        for name, r in kernels.items():
            x = min(refs) / r["fwd_bwd_ms"] if refs and r["fwd_bwd_ms"] > 0 else nan
            lines.append(f"{fw:<6} {name:<28} {r['fwd_ms']:>8.3f} {r['fwd_bwd_ms']:>8.3f} {'':>11} {x:>6.2f}")
        steps = part.get("steps", {})
        base = next((r.get("tokens_per_s") for r in steps.values()), None)
        for name, r in steps.items():
            tps = r.get("tokens_per_s") or nan
            note = "" if r["gate"]["passed"] else f"gate FAILED (loss diff {r['gate']['max_abs_diff_vs_unfused']})"
            lines.append(f"{fw:<6} {'step ' + name:<28} {'':>8} {r.get('step_ms', nan):>8.2f} {tps:>11,.0f} "
                         f"{tps / base if base else nan:>6.3f}  {note}")
        for e in part.get("errors", []):
            lines.append(f"{fw:<6} FAILED {e['what']}: {e['error'][:150]}")
        for what in part.get("skipped", []):
            lines.append(f"{fw:<6} skipped {what} (time budget)")
        lines.append(f"{fw:<6} {part.get('status', '')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the merged JSON file")
    p.add_argument("--smoke", action="store_true", help="smoke config on CPU; numbers are not results")
    p.add_argument("--parts", default="torch,jax")
    p.add_argument("--batch", type=int, default=None, help="default 1024 (smoke: 2)")
    p.add_argument("--budget-s", type=float, default=230.0)
    p.add_argument("--no-sweep", action="store_true", help="time only the default launch configurations")
    p.add_argument("--torch-configs", default=",".join(TORCH_DEFAULT))
    p.add_argument("--jax-configs", default=None)
    p.add_argument("--part", choices=("torch", "jax"), help=argparse.SUPPRESS)   # a child process
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from perfladder.config import get_config
    args.config = get_config("smoke" if args.smoke else "full")
    args.batch = args.batch or (2 if args.smoke else 1024)
    args.reps, args.warm, args.warmup, args.timed, args.windows = (1, 1, 0, 1, 1) if args.smoke else (20, 3, 5, 10, 3)
    args.gate_steps = 1 if args.smoke else GATE_STEPS
    from attention_kernel_jax import JAX_DEFAULT, JAX_STEPS
    args.torch_configs = args.torch_configs.split(",")
    args.jax_configs = args.jax_configs.split(",") if args.jax_configs else list(JAX_DEFAULT)
    for flag, names, valid in (("--torch-configs", args.torch_configs, TORCH_STEPS),
                               ("--jax-configs", args.jax_configs, JAX_STEPS)):
        bad = [c for c in names if c not in valid]
        if bad:
            p.error(f"{flag} {bad}: valid choices: {list(valid)}")
    if args.part:
        return child(args)
    parts = args.parts.split(",")
    if not set(parts) <= {"torch", "jax"}:
        p.error(f"--parts {parts}: valid choices: torch, jax")
    t0, out = time.time(), Path(args.out)
    merged = {"command": " ".join([Path(__file__).name, *(argv if argv is not None else sys.argv[1:])]),
              "created": time.strftime("%Y-%m-%d %H:%M:%S"), "budget_s": args.budget_s, "parts": {}}
    for i, part in enumerate(parts):
        share = 0.6 if (part == "torch" and len(parts) > 1 and i == 0) else 1.0
        deadline = t0 + share * args.budget_s if share < 1 else t0 + args.budget_s
        part_json = out.with_name(out.stem + f".{part}.json")
        cmd = [sys.executable, __file__, "--out", str(part_json), "--part", part, "--deadline", str(deadline),
               "--batch", str(args.batch), "--torch-configs", ",".join(args.torch_configs),
               "--jax-configs", ",".join(args.jax_configs)] + (["--smoke"] if args.smoke else []) \
            + (["--no-sweep"] if args.no_sweep else [])
        env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        try:
            proc = subprocess.run(cmd, env=env, timeout=max(30.0, deadline - time.time() + 60),
                                  capture_output=True, text=True)
            status = f"exit {proc.returncode}"
            log = proc.stdout[-20000:] + proc.stderr[-20000:]
        except subprocess.TimeoutExpired as e:
            status, log = "killed: past its deadline", f"{e.stdout or ''}{e.stderr or ''}"[-20000:]
        try:
            merged["parts"][part] = json.loads(part_json.read_text())
        except (OSError, ValueError):
            merged["parts"][part] = {"errors": [{"what": f"{part} part", "error": f"no results ({status})"}]}
        merged["parts"][part].update(status=status, log_tail=log[-4000:])
        print(log, flush=True)
    merged["wall_s"] = time.time() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=1, default=str) + "\n")
    print(table(merged), flush=True)
    failed = any(part.get("errors") or any(not c.get("passed") for c in part.get("checks", {}).values())
                 for part in merged["parts"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
