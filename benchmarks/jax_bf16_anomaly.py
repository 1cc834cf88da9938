"""Why is JAX's bf16 step at the big batch slower than fp32 on the H200, and why does it jitter?

Observed with the seed's recipe (bf16 threaded through every module, fp32 masters, batch 512):
fp32 runs a steady ~60 ms/step, bf16 wanders between ~90 and ~170 ms/step. The suspect: the
embedding's backward pass. Its gradient is a scatter-add of B*T = 65,536 rows into a table of
only V = 28 rows. In the bf16 model that scatter-add is issued in bf16, and a bf16 atomic add
on contended addresses is compiled to a compare-and-swap loop whose retries make the time both
long and erratic (openxla/xla#26371). ``GPT(embed_fp32=True)`` gathers from the fp32 table and
casts afterwards, so the scatter-add is f32 -- but on jaxlib 0.10.2-0.11.x an f32 atomic add
can itself be a CAS loop (an LLVM NVPTX change, jax-ml/jax#38806, openxla/xla#46225).
``GPT(embed='onehot')`` has no scatter at all: its gradient is a matmul.

One run (default variants, about two minutes on an H200) does, for each variant --

    fp32                  the fp32 model (R3c's configuration)
    bf16                  bf16 threaded, gather in bf16 (R3's configuration)
    bf16_embed_fp32       bf16, embedding looked up in fp32 (the first fix)
    bf16_onehot           bf16, one-hot matmul embedding (no scatter)
  and on request (--variants):
    bf16_onehot_fp32      bf16, one-hot matmul in fp32
    bf16_cudnn            bf16, cuDNN fused attention              (GPU only)
    bf16_embed_fp32_cudnn both                                     (GPU only)
    bf16_split            bf16, split/merge jax.jit step with donated state

-- per-step times with a device sync after *every* step (median / min / max / p10 / p90),
a ladder-style windowed throughput (no per-step sync), the compiler's planned temporaries and
FLOPs, the optimized HLO (written to files) and every ``scatter`` in it with its element types
(the embedding-gradient one flagged by its [V, D] shape), the scatter-add dtype the traced
program asks for (jaxpr, before XLA), on a GPU the atomic instructions in the PTX that XLA
generated (``XLA_FLAGS=--xla_dump_to=...``, set by this script before JAX starts; counted per
kernel: ``atom/red ... add.f32``, ``add.bf16``, ``cas``), and on a GPU a short profile
summarised by kernel (``perfladder.jax.kernels``).

The flag experiment. ``--ftz-atomics`` adds XLA_FLAGS
``--xla_backend_extra_options=-nvptx-allow-ftz-atomics`` (GPU only): the hidden LLVM option
that lets NVPTX emit the native f32 atomic add (which flushes denormals) instead of a CAS loop.
XLA reads XLA_FLAGS once, when the backend starts, so this is a separate run, not a ladder rung:

    python benchmarks/jax_bf16_anomaly.py --config full --out OUT/jax_bf16_anomaly.json
    python benchmarks/jax_bf16_anomaly.py --config full --ftz-atomics --variants fp32,bf16_embed_fp32 \\
        --out OUT/jax_bf16_anomaly_ftz.json
    python benchmarks/jax_bf16_anomaly.py --config smoke --out /tmp/anomaly.json   # CPU, tiny
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

VARIANTS = {
    "fp32": dict(dtype="float32"),
    "bf16": dict(dtype="bfloat16"),
    "bf16_embed_fp32": dict(dtype="bfloat16", embed_fp32=True),
    "bf16_onehot": dict(dtype="bfloat16", embed="onehot"),
    "bf16_onehot_fp32": dict(dtype="bfloat16", embed="onehot", embed_fp32=True),
    "bf16_cudnn": dict(dtype="bfloat16", attn_impl="cudnn"),
    "bf16_embed_fp32_cudnn": dict(dtype="bfloat16", embed_fp32=True, attn_impl="cudnn"),
    "bf16_split": dict(dtype="bfloat16", split=True),
}
DEFAULT_VARIANTS = ("fp32", "bf16", "bf16_embed_fp32", "bf16_onehot")
PROFILED = DEFAULT_VARIANTS
FTZ_OPTION = "-nvptx-allow-ftz-atomics"
STEP_MODULES = r".*(train_step|pure_step).*"     # the dumped modules: the training steps only


# -- PTX atomics ------------------------------------------------------------------------------
_ENTRY = re.compile(r"\.entry\s+([\w$.]+)\s*\(")
_ATOMIC = re.compile(r"\b((?:atom|red)\.[\w.]+)")


def classify_atomic(instr: str) -> str:
    """``atom.global.add.f32`` -> 'add.f32'; any ``...cas...`` -> 'cas'; bf16 / f16 adds too."""
    parts = instr.split(".")
    if "cas" in parts:
        return "cas"
    if "add" in parts:
        for t in ("f32", "bf16", "bf16x2", "f16", "f16x2", "f64"):
            if parts[-1] == t:
                return f"add.{t}"
        return "add.int"
    return "other"


def ptx_atomics(text: str) -> dict[str, dict[str, int]]:
    """Atomic instructions per kernel of a PTX module: ``{kernel: {'add.f32': n, 'cas': n, ...}}``.

    Only kernels that hold at least one atomic are listed. ``red.*`` (an atomic whose old value
    is unused) counts with ``atom.*``; every instruction is also counted under its full name.
    """
    starts = [(m.start(), m.group(1)) for m in _ENTRY.finditer(text)]
    out = {}
    for i, (pos, name) in enumerate(starts):
        body = text[pos:starts[i + 1][0] if i + 1 < len(starts) else len(text)]
        counts: dict[str, int] = {}
        for instr in _ATOMIC.findall(body):
            for key in (classify_atomic(instr), instr):
                counts[key] = counts.get(key, 0) + 1
        if counts:
            out[name] = counts
    return out


def summarize_ptx(files: list[Path]) -> dict:
    """The atomics of the scatter kernels (and of all kernels) in the dumped PTX ``files``."""
    kernels: dict[str, dict[str, int]] = {}
    for f in files:
        for name, counts in ptx_atomics(f.read_text(errors="replace")).items():
            kernels[f"{f.name}:{name}"] = counts
    kinds = ("add.f32", "add.bf16", "add.bf16x2", "add.f16", "cas")
    total = {k: sum(c.get(k, 0) for c in kernels.values()) for k in kinds}
    scatter = {k: c for k, c in kernels.items() if "scatter" in k.split(":")[-1]}
    in_scatter = {k: sum(c.get(k, 0) for c in scatter.values()) for k in kinds}
    return {"files": [str(f) for f in files], "kernels_with_atomics": kernels,
            "scatter_kernels": sorted(scatter), "scatter_atomics": in_scatter,
            "all_atomics": total}


# -- one variant ------------------------------------------------------------------------------
def run_variant(name, spec, lab, args, hlo_dir: Path, dump_dir: Path | None, jax, jnp):
    from perfladder.jax import Recipe
    from perfladder.jax.profile import per_step_times, step_stats
    from perfladder.jax.program import embedding_scatters, planned_temp_bytes, scatters_in_hlo
    from perfladder.jax.step import scatter_add_dtypes, traced_flops
    from perfladder.jax.timer import compile_count, throughput
    from perfladder.measure.timing import RecompileError
    cfg = lab.config
    kw = {k: v for k, v in spec.items() if k != "split"}
    recipe = Recipe(batch_size=cfg.big_batch, jit="split" if spec.get("split") else "nnx", **kw)
    step = lab.build_step(recipe)
    model, lower = step.model, step.lower
    stream = lab.stream(cfg.big_batch)
    X, Y = next(stream)
    rec = {"variant": name, "spec": spec, "recipe": recipe.to_dict(), "batch_size": cfg.big_batch,
           "seq_len": cfg.num_steps}
    table = tuple(model.token_emb.embedding.shape)
    rec["jaxpr_embedding_scatter_add"] = scatter_add_dtypes(model, X, Y)   # before any donation

    seen = set(dump_dir.rglob("*.ptx")) if dump_dir else set()
    t0 = time.perf_counter()
    jax.block_until_ready(step(X, Y))                  # the first call compiles (and dumps)
    rec["first_call_s"] = time.perf_counter() - t0
    if dump_dir is not None:
        rec["ptx"] = summarize_ptx(sorted(set(dump_dir.rglob("*.ptx")) - seen))
        if not rec["ptx"]["files"]:
            rec["ptx"]["note"] = (f"no new .ptx file under {dump_dir} after the first call; files "
                                  f"there: {sorted(p.name for p in dump_dir.iterdir())[:40]}")
    else:
        rec["ptx"] = {"skipped": args.ptx_skip_reason}

    compiled = lower(X, Y).compile()
    text = compiled.as_text()
    hlo_path = hlo_dir / f"{name}.hlo.txt"
    hlo_path.write_text(text)
    rec.update(hlo_file=str(hlo_path), planned_temp_bytes=planned_temp_bytes(compiled),
               traced_flops_per_step=traced_flops(model, X, Y), hlo_scatters=scatters_in_hlo(text, table))
    rec["hlo_embedding_scatter"] = embedding_scatters(text, table)
    rec["hlo_embedding_scatter_types"] = rec["hlo_embedding_scatter"]["types"]
    del compiled, text

    out = None
    for _ in range(args.warmup):
        out = step(*next(stream))
    jax.block_until_ready(out)
    before = compile_count()
    times = per_step_times(step, stream, args.steps)
    if compile_count() != before:
        raise RecompileError(f"{name}: {compile_count() - before} compilation(s) during the timed steps")
    rec["per_step"] = step_stats(times)
    rec["per_step_ms_all"] = [1e3 * t for t in times]
    rec["tokens_per_s_at_median"] = cfg.big_batch * cfg.num_steps / (rec["per_step"]["median_ms"] / 1e3)
    t = throughput(step, stream, warmup=2, timed=args.window, windows=3,
                   target_spread=cfg.target_spread, max_windows=cfg.max_windows)
    rec["windowed"] = {"tokens_per_s": t.tokens_per_s, "spread": t.spread,
                       "step_ms": 1e3 * t.step_time_s, "windows": t.windows}

    if args.profile and name in PROFILED:
        try:
            from perfladder.jax.kernels import kernel_breakdown
            kb = kernel_breakdown(step, stream, steps=args.profile_steps, warmup=2, top=12,
                                  hlo_text=hlo_path.read_text())
            rec["profile"] = kb.to_dict()
            rec["profile_text"] = str(kb)
            scat = [k for k in kb.top if "scatter" in k.name]
            rec["profile_scatter_ms_per_step"] = sum(k.total_us for k in scat) / kb.steps / 1e3
        except Exception as e:   # the diagnosis must not die with the profiler
            rec["profile_error"] = f"{type(e).__name__}: {e}"
    return rec


def verdict(results: dict) -> list[str]:
    lines = []
    med = {k: v["per_step"]["median_ms"] for k, v in results.items() if "per_step" in v}

    def spread(k):
        s = results[k]["per_step"]
        return f"{med[k]:.2f} ms (p10-p90 {s['p10_ms']:.1f}-{s['p90_ms']:.1f}, min-max {s['min_ms']:.1f}-{s['max_ms']:.1f})"

    if "fp32" in med and "bf16" in med:
        lines.append(f"bf16 vs fp32 median step: {spread('bf16')} vs {spread('fp32')} "
                     f"(bf16 is {'SLOWER' if med['bf16'] > med['fp32'] else 'faster'})")
    for k, v in results.items():
        if "hlo_embedding_scatter" in v:
            ptx = v.get("ptx", {})
            if ptx.get("files"):
                atom = f"; PTX atomics in scatter kernels {ptx['scatter_atomics']}"
            elif "skipped" in ptx:
                atom = f"; PTX not read ({ptx['skipped']})"
            elif ptx:   # counts over no files would read as "no atomics": say what happened
                atom = "; PTX atomics not read (XLA dumped no .ptx files)"
            else:
                atom = ""
            lines.append(f"{k}: embedding-gradient scatters in the optimized HLO "
                         f"{v['hlo_embedding_scatter']['count']} {v['hlo_embedding_scatter']['types']}, "
                         f"traced program asks for {v['jaxpr_embedding_scatter_add']}{atom}")
    for fix in ("bf16_embed_fp32", "bf16_onehot", "bf16_onehot_fp32"):
        if "bf16" in med and fix in med:
            lines.append(f"{fix}: {spread(fix)} vs bf16 {spread('bf16')}: the fix "
                         f"{'HELPS' if med[fix] < med['bf16'] else 'does not help'}")
    if "bf16" in med and "bf16_split" in med:
        lines.append(f"split/merge jax.jit step: {med['bf16_split']:.2f} ms vs nnx.jit {med['bf16']:.2f} ms "
                     "(the difference is host-side overhead per call)")
    return lines


# -- XLA flags, before JAX starts -------------------------------------------------------------
def add_backend_option(flags: str, option: str) -> str:
    """``flags`` with ``option`` appended to ``--xla_backend_extra_options`` (created if absent)."""
    prefix = "--xla_backend_extra_options="
    tokens = flags.split()
    for i, tok in enumerate(tokens):
        if tok.startswith(prefix):
            value = tok[len(prefix):]
            tokens[i] = prefix + (f"{value},{option}" if value else option)
            return " ".join(tokens)
    return " ".join(tokens + [prefix + option])


def prune_dump(dump_dir: Path) -> list[str]:
    """Keep only the PTX of a dump folder, gzipped (HLO texts are written separately)."""
    import gzip
    kept = []
    for f in sorted(dump_dir.rglob("*")):
        if not f.is_file():
            continue
        if f.suffix == ".ptx":
            gz = f.with_name(f.name + ".gz")
            gz.write_bytes(gzip.compress(f.read_bytes()))
            kept.append(str(gz))
        f.unlink()
    return kept


def _gpu_visible() -> bool:
    return shutil.which("nvidia-smi") is not None


def main(argv=None) -> int:
    import warnings
    warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")  # CPU only
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON summary path")
    p.add_argument("--config", default=None, help="smoke | full (default: full on a GPU, smoke otherwise)")
    p.add_argument("--variants", default=None,
                   help=f"comma-separated subset of {', '.join(VARIANTS)} (default: {', '.join(DEFAULT_VARIANTS)})")
    p.add_argument("--steps", type=int, default=None, help="per-step timed steps (default 40; smoke 6)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 10; smoke 2)")
    p.add_argument("--window", type=int, default=None, help="steps per windowed-throughput window")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                   help=f"profile a few steps of {', '.join(PROFILED)} (default: on a GPU)")
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--dump", action=argparse.BooleanOptionalAction, default=None,
                   help="dump the training steps' PTX with --xla_dump_to (default: on a GPU)")
    p.add_argument("--keep-dump", action="store_true",
                   help="keep every dumped file (default: only the PTX, gzipped, after counting)")
    p.add_argument("--ftz-atomics", action="store_true",
                   help=f"add --xla_backend_extra_options={FTZ_OPTION} to XLA_FLAGS (GPU only)")
    p.add_argument("--hlo-dir", default=None, help="where the HLO texts go (default: <out>_hlo/)")
    args = p.parse_args(argv)
    names = list(DEFAULT_VARIANTS) if args.variants is None else [
        v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; valid choices: {', '.join(VARIANTS)}")
    gpu_seen = _gpu_visible()
    if args.ftz_atomics and not gpu_seen:
        p.error(f"--ftz-atomics passes an NVPTX (GPU) option to LLVM ({FTZ_OPTION}); no GPU found")

    out = Path(args.out)
    hlo_dir = Path(args.hlo_dir) if args.hlo_dir else out.with_name(out.stem + "_hlo")
    hlo_dir.mkdir(parents=True, exist_ok=True)
    # XLA reads XLA_FLAGS once, when JAX's backend starts: everything goes in before that.
    flags = os.environ.get("XLA_FLAGS", "")
    if args.ftz_atomics:
        flags = add_backend_option(flags, FTZ_OPTION)
    dump_dir = None
    if args.dump if args.dump is not None else gpu_seen:
        dump_dir = out.with_name(out.stem + "_dump")
        if dump_dir.exists():
            shutil.rmtree(dump_dir)
        dump_dir.mkdir(parents=True)
        flags = f"{flags} --xla_dump_to={dump_dir} --xla_dump_hlo_module_re={STEP_MODULES}".strip()
    os.environ["XLA_FLAGS"] = flags
    args.ptx_skip_reason = "PTX dump switched off (--no-dump)"

    from perfladder.config import pick_config
    cfg_name = args.config
    if cfg_name == "smoke" or (cfg_name is None and not gpu_seen):
        from perfladder.jax.compiler import fast_cpu_compiles
        fast_cpu_compiles()
    import jax
    import jax.numpy as jnp

    from perfladder.jax import JaxLab, has_gpu, versions
    gpu = has_gpu()
    if not gpu:
        args.ptx_skip_reason = "CPU run: XLA:CPU generates host code, there is no PTX; run on a GPU"
        dump_dir = None
    cfg = pick_config(cfg_name, has_gpu=gpu)
    smoke = cfg.is_smoke
    args.steps = args.steps or (6 if smoke else 40)
    args.warmup = args.warmup or (2 if smoke else 10)
    args.window = args.window or (3 if smoke else 15)
    args.profile = gpu if args.profile is None else args.profile

    lab = JaxLab(cfg, command="benchmarks/jax_bf16_anomaly.py " + " ".join(sys.argv[1:]), probe=False)
    summary = {"device": lab.device_name, "config": cfg.to_dict(), "versions": versions(),
               "settings": {"steps": args.steps, "warmup": args.warmup, "window": args.window,
                            "profile": args.profile, "ftz_atomics": args.ftz_atomics,
                            "dump_dir": None if dump_dir is None else str(dump_dir)},
               "xla_flags": os.environ.get("XLA_FLAGS", ""), "notes": list(lab.result.notes),
               "variants": {}, "skipped": {}}
    if args.ftz_atomics:   # did XLA take the option? (reading CompileOptions parses XLA_FLAGS)
        from jaxlib import xla_client
        summary["ftz_atomics_in_effect"] = FTZ_OPTION.encode() in xla_client.CompileOptions().SerializeAsString()
    t_start = time.perf_counter()
    for name in names:
        spec = VARIANTS[name]
        if spec.get("attn_impl") == "cudnn" and not gpu:
            summary["skipped"][name] = "not applicable on CPU: cudnn attention needs a CUDA GPU"
            print(f"[{name}] skipped: cudnn attention needs a CUDA GPU", flush=True)
            continue
        print(f"[{name}] ...", flush=True)
        try:
            rec = run_variant(name, spec, lab, args, hlo_dir, dump_dir, jax, jnp)
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
        print(f"[{name}] embedding-grad scatter: HLO {rec['hlo_embedding_scatter']}, "
              f"jaxpr {rec['jaxpr_embedding_scatter_add']}; all HLO scatters: "
              f"{[(x['name'], x['element_types']) for x in rec['hlo_scatters']]}", flush=True)
        ptx = rec["ptx"]
        print(f"[{name}] PTX: " + (f"scatter kernels {ptx['scatter_kernels']}, their atomics "
                                   f"{ptx['scatter_atomics']}, all kernels {ptx['all_atomics']}"
                                   if "scatter_atomics" in ptx else str(ptx)), flush=True)
        if "profile_text" in rec:
            print(rec["profile_text"], flush=True)
        elif "profile_error" in rec:
            print(f"[{name}] profile failed: {rec['profile_error']}", flush=True)
    summary["verdict"] = verdict(summary["variants"])
    if dump_dir is not None and not args.keep_dump:
        summary["settings"]["dump_kept"] = prune_dump(dump_dir)
    summary["seconds"] = time.perf_counter() - t_start
    print("\n".join(["verdict:"] + ["  " + v for v in summary["verdict"]]), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"wrote {out} (HLO texts in {hlo_dir}) after {summary['seconds']:.0f}s", flush=True)
    return 0


def scatters_in_hlo(text: str, table_shape: tuple[int, int]) -> list[dict]:
    """``perfladder.jax.program.scatters_in_hlo`` (kept here for the script's readers and tests)."""
    from perfladder.jax.program import scatters_in_hlo as parse
    return parse(text, table_shape)


if __name__ == "__main__":
    sys.exit(main())
