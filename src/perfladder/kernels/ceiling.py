"""The model's ceiling on a run's device: one number per run, from that run's own probe
(no framework imports).

``ceiling(result)`` is the one source every page, figure and inserted number reads: the
tokens/s the model would reach if every FLOP of a training step (``6N + 12LTD`` per token)
ran at the large bf16 matmul rate the same run measured (``LadderResult.roofs``, probed by
the run's lab before its first rung), named with that probe. Runs on one GPU type probe
different rates (clocks, drivers, the framework's own matmul), so each run is read against
its own, never against another run's or the highest seen; ``probe_spread(results)`` says once
how far the probes of one device differ.
"""
from __future__ import annotations

import dataclasses

from perfladder.config import LadderConfig, expected_num_params, flops_per_token

ROOF_KEY = "matmul_bf16_tflops"
# Both labs' probes (``perfladder.<side>.device.probe_roofs``) time chains of PROBE_CHAIN
# dependent PROBE_N x PROBE_N products, so the two sides' ceilings are one quantity
PROBE_N = 8192
PROBE_CHAIN = 10


def model_flops_per_token(config: dict) -> int:
    """``6 N + 12 L T D`` of the model a results file's ``config`` dict describes."""
    fields = {f.name for f in dataclasses.fields(LadderConfig)}
    cfg = LadderConfig(**{k: v for k, v in (config or {}).items() if k in fields})
    gpt = cfg.gpt()
    return flops_per_token(expected_num_params(gpt), gpt.num_blks, cfg.num_steps, gpt.num_hiddens)


def ceiling(result) -> dict | None:
    """The model's tokens/s at ``result``'s own measured bf16 matmul rate, or ``None`` when the
    run carries no measured roofs: ``{'tokens_per_s', 'tflops', 'flops_per_token', 'source',
    'device', 'framework', 'label'}`` (``label``: the ceiling named with its probe, as a page
    says it)."""
    roofs = getattr(result, "roofs", None) or {}
    tf = roofs.get(ROOF_KEY)
    if not tf:
        return None
    fpt = model_flops_per_token(result.config)
    source = roofs.get("source") or f"the {result.framework} lab's probe"
    return {"tokens_per_s": tf * 1e12 / fpt, "tflops": tf, "flops_per_token": fpt,
            "source": source, "device": result.device, "framework": result.framework,
            "label": f"{tf:.0f} TFLOP/s bf16 matmul measured by this run ({source})"}


def timed_as(roofs: dict) -> str:
    """How a probe timed its matmul, from its recorded method: ``'chains'`` (dependent products
    back to back, the sustained rate a step's GEMMs run at: both labs' probes today) or
    ``'one product'`` (a lone product between idle gaps, which a power-capped card runs at a
    higher clock: PyTorch's probe before it timed chains)."""
    method = (roofs or {}).get("method") or ""
    return "chains" if ("chain of" in method or "loop of" in method) else "one product"


TIMED_WORDS = {"chains": "chains of products", "one product": "one product at a time"}
# what a table of ceilings says its probe timed
PROBED_WORDS = {"chains": "large square matmuls timed in chains, back to back",
                "one product": "a large square matmul timed alone"}


def probe_spread(results) -> list[dict]:
    """Per device, framework and way of timing (``timed_as``) among ``results`` with a probe
    (each framework's lab probes the matmul through its own compiler): ``{'device',
    'framework', 'timed', 'runs', 'low', 'high', 'spread'}`` of their bf16 matmul rates
    (``spread``: high / low - 1), in first-seen order. Probes timed differently are not one
    quantity, so they are never one spread."""
    seen: dict[tuple[str, str, str], list[float]] = {}
    for res in results:
        roofs = getattr(res, "roofs", None) or {}
        if roofs.get(ROOF_KEY):
            key = (res.device, prober(res), timed_as(roofs))
            seen.setdefault(key, []).append(float(roofs[ROOF_KEY]))
    return [{"device": d, "framework": fw, "timed": how, "runs": len(v), "low": min(v),
             "high": max(v), "spread": max(v) / min(v) - 1} for (d, fw, how), v in seen.items()]


FRAMEWORK_WORDS = {"torch": "PyTorch", "jax": "JAX"}
PROBE_SCRIPT = "device_probe.py"


def prober(result) -> str:
    """Who measured a run's roofs: its framework's lab (``'torch'`` / ``'jax'``), or, for a file
    that carried none, ``benchmarks/device_probe.py`` beside it (``results.committed``)."""
    source = ((getattr(result, "roofs", None) or {}).get("source") or "")
    return PROBE_SCRIPT if "device.json" in source else result.framework


def spread_sentence(results) -> str:
    """One sentence: how far the probes of one device differ between runs, per framework, and
    that each run is read against its own ("" when no framework has two probed runs there)."""
    def who(s):
        fw = s["framework"]
        return PROBE_SCRIPT if fw == PROBE_SCRIPT else f"{FRAMEWORK_WORDS.get(fw, fw)}'s probe"
    parts = [f"{who(s)} ({TIMED_WORDS[s['timed']]}) on the {s['device']} measured between "
             f"{s['low']:.0f} and {s['high']:.0f} "
             f"TFLOP/s over {s['runs']} runs ({100 * s['spread']:.0f}% apart)"
             for s in probe_spread(results) if s["runs"] >= 2]
    if not parts:
        return ""
    return ("The bf16 matmul rate a run probes is not one number per GPU type: "
            + "; ".join(parts) + ". Each run is read against its own probe.")
