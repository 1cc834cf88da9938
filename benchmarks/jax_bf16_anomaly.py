"""Why is JAX's bf16 step at the big batch slower than fp32 on the H200, and why does it jitter?

Observed with the seed's recipe (bf16 threaded through every module, fp32 masters, batch 512):
fp32 runs a steady ~60 ms/step, bf16 wanders between ~90 and ~170 ms/step. The suspect: the
embedding's backward pass. Its gradient is a scatter-add of B*T = 65,536 rows into a table of
only V = 28 rows; in the bf16 model that scatter-add runs in bf16, where the GPU has no cheap
atomic add, so the heavily contended rows may be served by compare-and-swap loops whose
retries make the time both long and erratic. ``GPT(embed_fp32=True)`` gathers from the fp32
table and casts afterwards, so the scatter-add happens in fp32.

One run (a few minutes on the GPU) does, for each variant --

    fp32                  the fp32 model
    bf16                  bf16 threaded (R3's configuration)
    bf16_embed_fp32       bf16, embedding gathered in fp32 (the candidate fix)
    bf16_cudnn            bf16, cuDNN fused attention              (GPU only)
    bf16_embed_fp32_cudnn both                                     (GPU only)
    bf16_split            bf16, stepped by a jax.jit split/merge step with donated state
                          (no per-call nnx graph walk: separates host overhead from device time)

-- per-step times with a device sync after *every* step (median / min / max / p10 / p90),
a ladder-style windowed throughput (no per-step sync), the compiler's planned temporaries and
FLOPs, the optimized HLO (``compiled.as_text()``, written to files) and every ``scatter`` in
it with its element types (the embedding-gradient one flagged by its [V, D] shape), the
scatter-add dtype the traced program asks for (jaxpr, before XLA), and optionally a short
profile summarised by kernel (``perfladder.jax.kernels``, no TensorBoard needed).

    python benchmarks/jax_bf16_anomaly.py --out benchmarks/results/h200/jax_bf16_anomaly.json
    python benchmarks/jax_bf16_anomaly.py --config smoke --out /tmp/anomaly.json   # CPU, tiny
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

VARIANTS = {
    "fp32": dict(dtype="float32"),
    "bf16": dict(dtype="bfloat16"),
    "bf16_embed_fp32": dict(dtype="bfloat16", embed_fp32=True),
    "bf16_cudnn": dict(dtype="bfloat16", attn_impl="cudnn"),
    "bf16_embed_fp32_cudnn": dict(dtype="bfloat16", embed_fp32=True, attn_impl="cudnn"),
    "bf16_split": dict(dtype="bfloat16", split=True),
}
PROFILED = ("fp32", "bf16", "bf16_embed_fp32")

# `%name = bf16[28,512]{1,0} scatter(bf16[28,512]{1,0} %a, s32[65536,1]{1,0} %b, ...), ...`
_SCATTER = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<out>\(?[\w\[\],{}:\s]*?\)?)\s+"
                      r"scatter\((?P<args>[^)]*)\)")
_TYPE = re.compile(r"\b(pred|[sfu]\d+|bf16|f8\w*)\[([\d,]*)\]")


def scatters_in_hlo(text: str, table_shape: tuple[int, int]) -> list[dict]:
    """Every ``scatter`` instruction of an HLO module text, with element types and shapes.

    Fused computations are part of ``as_text()``, so scatters inside fusions are listed too.
    ``embedding_grad`` marks the one whose result has the embedding table's shape [V, D].
    """
    out = []
    for line in text.splitlines():
        m = _SCATTER.search(line)
        if not m:
            continue
        results = _TYPE.findall(m.group("out"))
        operands = _TYPE.findall(m.group("args"))
        shapes = [[int(d) for d in dims.split(",") if d] for _, dims in results]
        out.append({
            "name": m.group("name"),
            "result_types": [f"{t}[{d}]" for t, d in results],
            "operand_types": [f"{t}[{d}]" for t, d in operands],
            "element_types": sorted({t for t, _ in results + operands if not t.startswith(("s", "u"))}),
            "embedding_grad": any(tuple(s) == tuple(table_shape) for s in shapes),
            "line": line.strip()[:400],
        })
    return out


def per_step_times(step, stream, n: int, sync) -> list[float]:
    """Seconds of each of ``n`` steps, each closed by a device sync (batch draw included)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        X, Y = next(stream)
        sync(step(X, Y))
        times.append(time.perf_counter() - t0)
    return times


def stats_ms(times: list[float]) -> dict:
    ms = sorted(1e3 * t for t in times)
    q = lambda p: ms[min(len(ms) - 1, int(round(p * (len(ms) - 1))))]  # noqa: E731
    return {"median_ms": statistics.median(ms), "min_ms": ms[0], "max_ms": ms[-1],
            "p10_ms": q(0.10), "p90_ms": q(0.90), "mean_ms": statistics.fmean(ms),
            "stdev_ms": statistics.stdev(ms) if len(ms) > 1 else 0.0, "n": len(ms)}


def run_variant(name, spec, ladder, args, hlo_dir: Path, jax, jnp):
    from perfladder.jax.steps import scatter_add_dtypes, xla_flops, planned_temp_bytes
    from perfladder.jax.timer import compile_count, throughput
    from perfladder.timing import RecompileError
    cfg = ladder.config
    from perfladder.jax.steps import make_split_step
    dtype = getattr(jnp, spec["dtype"])
    kw = {k: v for k, v in spec.items() if k not in ("dtype", "split")}
    model, opt = ladder.build(dtype, **kw)
    if spec.get("split"):
        split = make_split_step(model, opt)
        step, lower = split, split.lower
    else:
        step = lambda X, Y: ladder.step(model, opt, X, Y)  # noqa: E731
        lower = lambda X, Y: ladder.step.lower(model, opt, X, Y)  # noqa: E731
    stream = ladder.stream(cfg.big_batch)
    X, Y = next(stream)
    rec = {"variant": name, "spec": spec, "batch_size": cfg.big_batch, "seq_len": cfg.num_steps}
    table = tuple(model.token_emb.embedding.shape)
    rec["jaxpr_embedding_scatter_add"] = scatter_add_dtypes(model, X, Y)   # before any donation

    t0 = time.perf_counter()
    jax.block_until_ready(step(X, Y))
    rec["first_call_s"] = time.perf_counter() - t0

    compiled = lower(X, Y).compile()
    text = compiled.as_text()
    hlo_path = hlo_dir / f"{name}.hlo.txt"
    hlo_path.write_text(text)
    rec.update(hlo_file=str(hlo_path), planned_temp_bytes=planned_temp_bytes(compiled),
               xla_flops_per_step=xla_flops(compiled), hlo_scatters=scatters_in_hlo(text, table))
    emb = [s for s in rec["hlo_scatters"] if s["embedding_grad"]]
    rec["hlo_embedding_scatter_types"] = sorted({t for s in emb for t in s["element_types"]})

    out = None
    for _ in range(args.warmup):
        out = step(*next(stream))
    jax.block_until_ready(out)
    before = compile_count()
    times = per_step_times(step, stream, args.steps, jax.block_until_ready)
    if compile_count() != before:
        raise RecompileError(f"{name}: {compile_count() - before} compilation(s) during the timed steps")
    rec["per_step"] = stats_ms(times)
    rec["per_step_ms_all"] = [1e3 * t for t in times]
    rec["tokens_per_s_at_median"] = cfg.big_batch * cfg.num_steps / (rec["per_step"]["median_ms"] / 1e3)
    t = throughput(step, stream, warmup=2, timed=args.window, windows=3)
    rec["windowed"] = {"tokens_per_s": t.tokens_per_s, "spread": t.spread,
                       "step_ms": 1e3 * t.step_time_s, "windows": t.windows}

    if args.profile and name in PROFILED:
        try:
            from perfladder.jax.kernels import kernel_breakdown
            kb = kernel_breakdown(step, stream, steps=args.profile_steps, warmup=2, top=12,
                                  hlo_text=text)
            rec["profile"] = kb.to_dict()
            rec["profile_text"] = str(kb)
        except Exception as e:   # the diagnosis must not die with the profiler
            rec["profile_error"] = f"{type(e).__name__}: {e}"
    return rec


def verdict(results: dict) -> list[str]:
    lines = []
    med = {k: v["per_step"]["median_ms"] for k, v in results.items() if "per_step" in v}
    if "fp32" in med and "bf16" in med:
        lines.append(f"bf16 vs fp32 median step: {med['bf16']:.2f} vs {med['fp32']:.2f} ms "
                     f"(bf16 is {'SLOWER' if med['bf16'] > med['fp32'] else 'faster'})")
    if "bf16" in results and "hlo_embedding_scatter_types" in results["bf16"]:
        t16 = results["bf16"]["hlo_embedding_scatter_types"]
        lines.append(f"embedding-gradient scatter in the optimized bf16 HLO: element types {t16 or 'none found'}"
                     f"; the traced program asks for {results['bf16']['jaxpr_embedding_scatter_add']}")
    if "bf16_embed_fp32" in results and "hlo_embedding_scatter_types" in results["bf16_embed_fp32"]:
        t32 = results["bf16_embed_fp32"]["hlo_embedding_scatter_types"]
        lines.append(f"with embed_fp32: element types {t32 or 'none found'}")
    if "bf16" in med and "bf16_split" in med:
        lines.append(f"split/merge jax.jit step: {med['bf16_split']:.2f} ms vs nnx.jit {med['bf16']:.2f} ms "
                     "(the difference is host-side overhead per call)")
    if "bf16" in med and "bf16_embed_fp32" in med:
        j16 = results["bf16"]["per_step"]
        jfx = results["bf16_embed_fp32"]["per_step"]
        lines.append(f"embed_fp32 median {med['bf16_embed_fp32']:.2f} ms (p10-p90 {jfx['p10_ms']:.1f}-"
                     f"{jfx['p90_ms']:.1f}) vs bf16 {med['bf16']:.2f} ms (p10-p90 {j16['p10_ms']:.1f}-"
                     f"{j16['p90_ms']:.1f}): the fix {'HELPS' if med['bf16_embed_fp32'] < med['bf16'] else 'does not help'}")
    return lines


def main(argv=None) -> int:
    import warnings
    warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")  # CPU only
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON summary path")
    p.add_argument("--config", default=None, help="smoke | full (default: full on a GPU, smoke otherwise)")
    p.add_argument("--variants", default=None, help=f"comma-separated subset of {', '.join(VARIANTS)}")
    p.add_argument("--steps", type=int, default=None, help="per-step timed steps (default 60; smoke 6)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 20; smoke 2)")
    p.add_argument("--window", type=int, default=None, help="steps per windowed-throughput window")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                   help="profile a few steps of fp32 / bf16 / bf16_embed_fp32 (default: on a GPU)")
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--hlo-dir", default=None, help="where the HLO texts go (default: <out>_hlo/)")
    args = p.parse_args(argv)

    from perfladder.config import pick_config
    cfg_name = args.config
    if cfg_name == "smoke" or (cfg_name is None and not _gpu_visible()):
        from perfladder.jax.timer import fast_cpu_compiles
        fast_cpu_compiles()
    import jax
    import jax.numpy as jnp
    from perfladder.jax import Ladder, has_gpu, versions
    gpu = has_gpu()
    cfg = pick_config(cfg_name, has_gpu=gpu)
    smoke = cfg.is_smoke
    args.steps = args.steps or (6 if smoke else 60)
    args.warmup = args.warmup or (2 if smoke else 20)
    args.window = args.window or (3 if smoke else 20)
    args.profile = gpu if args.profile is None else args.profile
    names = list(VARIANTS) if args.variants is None else [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; valid choices: {', '.join(VARIANTS)}")

    out = Path(args.out)
    hlo_dir = Path(args.hlo_dir) if args.hlo_dir else out.with_name(out.stem + "_hlo")
    hlo_dir.mkdir(parents=True, exist_ok=True)
    ladder = Ladder(cfg, command="benchmarks/jax_bf16_anomaly.py " + " ".join(sys.argv[1:]))
    summary = {"device": ladder.device, "config": cfg.to_dict(), "versions": versions(),
               "settings": {"steps": args.steps, "warmup": args.warmup, "window": args.window,
                            "profile": args.profile},
               "xla_flags": __import__("os").environ.get("XLA_FLAGS", ""),
               "variants": {}, "skipped": {}}
    t_start = time.perf_counter()
    for name in names:
        spec = VARIANTS[name]
        if spec.get("attn_impl") == "cudnn" and not gpu:
            summary["skipped"][name] = "cudnn attention needs a CUDA GPU"
            print(f"[{name}] skipped: cudnn attention needs a CUDA GPU", flush=True)
            continue
        print(f"[{name}] ...", flush=True)
        try:
            rec = run_variant(name, spec, ladder, args, hlo_dir, jax, jnp)
        except Exception as e:   # one failing variant (e.g. cudnn refusing a shape) must not hide the rest
            summary["skipped"][name] = f"failed: {type(e).__name__}: {e}"[:2000]
            print(f"[{name}] FAILED: {type(e).__name__}: {e}", flush=True)
            continue
        summary["variants"][name] = rec
        s = rec["per_step"]
        print(f"[{name}] per-step ms: median {s['median_ms']:.2f}, min {s['min_ms']:.2f}, "
              f"max {s['max_ms']:.2f} (p10 {s['p10_ms']:.2f}, p90 {s['p90_ms']:.2f}); "
              f"windowed {rec['windowed']['tokens_per_s']:,.0f} tokens/s; "
              f"planned temp {(rec['planned_temp_bytes'] or 0) / 2**30:.2f} GiB", flush=True)
        print(f"[{name}] embedding-grad scatter: HLO {rec['hlo_embedding_scatter_types']}, "
              f"jaxpr {rec['jaxpr_embedding_scatter_add']}; all HLO scatters: "
              f"{[(x['name'], x['element_types']) for x in rec['hlo_scatters']]}", flush=True)
        if "profile_text" in rec:
            print(rec["profile_text"], flush=True)
        elif "profile_error" in rec:
            print(f"[{name}] profile failed: {rec['profile_error']}", flush=True)
    summary["verdict"] = verdict(summary["variants"])
    summary["seconds"] = time.perf_counter() - t_start
    print("\n".join(["verdict:"] + ["  " + v for v in summary["verdict"]]), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"wrote {out} (HLO texts in {hlo_dir}) after {summary['seconds']:.0f}s", flush=True)
    return 0


def _gpu_visible() -> bool:
    import shutil
    return shutil.which("nvidia-smi") is not None


if __name__ == "__main__":
    sys.exit(main())
