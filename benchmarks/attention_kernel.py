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
from fused_kernels import GATE_STEPS, Results  # noqa: E402  (sets TRITON_INTERPRET on CPU)

STEP_COST_S = {"torch": 40, "jax": 35}   # a step configuration's compile + gate + timing on a GPU
CHECK_BATCH = 64          # sequences in the float64 correctness check


class Budgeted(Results):
    """``Results`` with a deadline: what would start too late is recorded as skipped."""

    def __init__(self, path: Path, head: dict, deadline: float | None):
        super().__init__(path, head)
        self.deadline = deadline
        self.data.update(checks={}, fused_configs={}, mlp_configs={}, skipped=[])
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


# -- the driver ---------------------------------------------------------------------------------
def child(args) -> int:
    res = Budgeted(Path(args.out), {"framework": args.part, "config": args.config.name,
                                    "batch": args.batch, "smoke": args.smoke}, args.deadline)
    if args.part == "torch":
        from attention_kernel_torch import run_torch
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
        group = lambda n: "ffn" if n.startswith("ffn") else "attention"  # noqa: E731
        refs = {}
        for n, r in kernels.items():
            if n not in ("fused", "ffn_fused"):
                refs[group(n)] = min(refs.get(group(n), float("inf")), r["fwd_bwd_ms"])
        for name, r in kernels.items():
            best = refs.get(group(name))
            x = best / r["fwd_bwd_ms"] if best and r["fwd_bwd_ms"] > 0 else nan
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
    p.add_argument("--torch-configs", default=None)
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
    from attention_kernel_torch import TORCH_DEFAULT, TORCH_STEPS
    args.torch_configs = args.torch_configs.split(",") if args.torch_configs else list(TORCH_DEFAULT)
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
