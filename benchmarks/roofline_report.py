"""Print the roofline table (``perfladder.kernels.roofline``) of the fastest profiled rung of ladder results.

    python benchmarks/roofline_report.py benchmarks/results/h200-run2/torch.json \
        benchmarks/results/h200-run2/jax.json --device benchmarks/results/h200-book/device.json

For each results JSON: the rung with a kernel breakdown (``extra['kernels']``) and the most
tokens/s, its shapes (batch from the rung, width/blocks/heads/context from the ladder config),
its precision, and the workload of its own recipe (``perfladder.kernels.accounting.workload_of``:
the residual stream's dtype, and no RoPE pass where the attention kernel does it). The roofs
come from ``benchmarks/device_probe.py``'s JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from perfladder.kernels.accounting import FRAMEWORKS, workload_of
from perfladder.kernels.roofline import Roofs, roofline


def fastest_profiled(result: dict) -> dict:
    rungs = [r for r in result["rungs"] if "kernels" in r.get("extra", {}) and r.get("tokens_per_s")]
    if not rungs:
        raise SystemExit(f"no rung with extra['kernels'] in the {result.get('framework')} results")
    return max(rungs, key=lambda r: r["tokens_per_s"])


def report(result: dict, probe: dict, vocab: int, probe_name: str = "") -> str:
    fw, rung, cfg = result["framework"], fastest_profiled(result), result["config"]
    if fw not in FRAMEWORKS:
        raise SystemExit(f"framework={fw!r} is not valid; valid choices: {FRAMEWORKS}")
    precision = "bf16" if rung.get("precision") == "bf16" else "fp32"
    recipe = rung["extra"].get("kernels_recipe", {})
    gpt = SimpleNamespace(num_hiddens=cfg["num_hiddens"], num_heads=cfg["num_heads"],
                          num_blks=cfg["num_blks"], vocab_size=vocab)
    w = workload_of(fw, recipe, gpt, batch=rung["batch_size"], seq=rung.get("seq_len") or cfg["num_steps"],
                    precision=precision)
    roofs = Roofs.from_probe(probe, precision, source=probe_name or probe.get("device", ""))
    title = (f"{fw} {rung['name']} ({rung['label']}): {rung['tokens_per_s'] / 1e6:.2f}M tokens/s measured "
             f"= {w.tokens / rung['tokens_per_s'] * 1e3:.2f} ms/step wall")
    return roofline(rung["extra"]["kernels"], w, roofs, title=title).markdown()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="ladder results JSON files (perfladder run --out)")
    p.add_argument("--device", required=True, help="device_probe.py JSON of the same GPU")
    p.add_argument("--vocab", type=int, default=28)
    args = p.parse_args(argv)
    probe = json.loads(Path(args.device).read_text())
    parts = [report(json.loads(Path(f).read_text()), probe, args.vocab, f"measured, {args.device}")
             for f in args.results]
    sys.stdout.write("\n\n".join(parts) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
