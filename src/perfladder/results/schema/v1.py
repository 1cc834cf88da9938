"""Version-1 results files (free-form ``extra`` dicts) read as version 2.

Every committed GPU run before the engine redesign is a version-1 file; they keep rendering.
Known ``extra`` entries move into the typed slots; the rest stays in ``details`` as written.
"""
from __future__ import annotations

import re

from perfladder.measure.evidence import dtype_name
from perfladder.results.version import ResultsError

# v1 rung names -> technique keys (B names differed per framework in v1).
KEYS = {
    "torch": {"R0": "eager", "R1": "compile", "R2": "bf16", "R3c": "fp32_control", "R3": "batch_up",
              "R4": "checkpoint", "R5": "data_parallel", "B1": "fused_adamw", "B2": "compiled_adamw",
              "B3": "cuda_graphs", "B4": "onehot_embedding", "B5": "batch_x2", "B6": "batch_x4",
              "B7": "attention_kernel", "B8": "max_autotune"},
    "jax": {"R0": "eager", "R1": "compile", "R2a": "bf16_naive_cast", "R2": "bf16",
            "R3c": "fp32_control", "R3": "batch_up", "R4": "checkpoint", "R5": "data_parallel",
            "R5f": "fsdp", "B1": "embed_fp32_lookup", "B2": "onehot_embedding", "B3": "split_jit",
            "B4": "attention_kernel", "B5": "batch_x2", "B6": "batch_x4"},
}
# What each v1 seed rung changed (the beyond rungs stored theirs in extra['builds_on']).
SEED_BUILDS_ON = {"R1": "R0", "R2": "R1", "R2a": "R1", "R3c": "R1", "R3": "R2", "R4": "R3",
                  "R5": "R3"}
_CPU_TOTAL = re.compile(r"Self CPU time total:\s*([\d.]+)\s*(us|ms|s)")
_DEV_TOTAL = re.compile(r"Self (?:CUDA|XPU|device) time total:\s*([\d.]+)\s*(us|ms|s)")
_UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(rx, text: str) -> float | None:
    m = rx.search(text or "")
    return None if m is None else float(m.group(1)) * _UNIT_MS[m.group(2)]


def _profile(extra: dict, steps: int):
    """A ProfileSummary dict from v1 evidence: torch's profiler table totals, the kernel
    breakdown's category shares, JAX's dispatch timing."""
    out = None
    table = extra.get("profile")
    if isinstance(table, str):
        host, dev = _ms(_CPU_TOTAL, table), _ms(_DEV_TOTAL, table)
        out = {"tool": "torch.profiler", "steps": steps,
               "host_ms": None if host is None else host / steps,
               "device_ms": None if dev is None or dev == 0 else dev / steps, "shares": {}, "rows": []}
    kb = extra.get("kernels")
    if isinstance(kb, dict) and kb.get("category_share"):
        out = out or {"tool": f"{kb.get('framework', '?')} kernel breakdown", "steps": kb.get("steps", 1),
                      "host_ms": None, "device_ms": kb.get("per_step_ms"), "rows": []}
        out["shares"] = dict(kb["category_share"])
        if out.get("device_ms") is None:
            out["device_ms"] = kb.get("per_step_ms")
    ho = extra.get("host_overhead")
    if isinstance(ho, dict) and isinstance(ho.get("split"), dict):
        split = ho["split"]
        out = out or {"tool": "dispatch timing", "steps": split.get("n", 1), "shares": {}, "rows": []}
        out["host_ms"], out["device_ms"] = split["dispatch_ms_per_step"], split["synced_median_ms"]
    return out


def _rung(r: dict, framework: str, config: dict) -> dict:
    extra = dict(r.get("extra") or {})
    name = r["name"]
    keys = KEYS[framework]
    key = keys.get(name, re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "rung")
    measured = r.get("tokens_per_s") is not None and r.get("kind") != "skipped"
    steps = 5 if config.get("name") == "full" else 2
    out = {"name": name, "key": key, "label": r["label"], "kind": r["kind"],
           "stage": "beyond" if name.startswith("B") else
                    ("multi-gpu" if r["kind"] == "multi-gpu" else "seed"),
           "tokens_per_s": r.get("tokens_per_s") if measured else None,
           "precision": r.get("precision", "tf32"), "batch_size": r.get("batch_size"),
           "seq_len": r.get("seq_len"),
           "builds_on": extra.pop("builds_on", SEED_BUILDS_ON.get(name)),
           "recipe": extra.pop("recipe", {}) or {}, "kept": extra.pop("kept", None),
           "tflops": r.get("tflops"), "mfu": r.get("mfu"), "gates": [], "notes": list(r.get("notes", [])),
           "error": None if measured else "; ".join(r.get("notes", [])) or "not measured"}
    if measured:
        windows = r.get("windows") or [r["tokens_per_s"]]
        secs = extra.pop("seconds", None) or [1.0 for _ in windows]
        out["timing"] = {"windows": windows, "seconds": secs, "settled": len(windows),
                         "stable": None, "target_spread": None,
                         "steps_per_window": int(extra.pop("steps_per_window", 1) or 1),
                         "warmup": int(extra.pop("warmup", 0) or 0),
                         "batch_shape": [b for b in (r.get("batch_size"), r.get("seq_len")) if b]}
    mem = r.get("peak_mem_bytes")
    if mem is not None:
        out["memory"] = {"bytes": mem, "kind": "measured peak" if framework == "torch"
                         else "planned temporaries"}
    first = extra.pop("compile_s", None) or extra.pop("first_call_s", None)
    if first is not None:
        out["compile"] = {"first_call_s": first,
                          "compilations": extra.pop("first_call_compilations", None)}
    got = extra.pop("logits_dtype", None) or extra.pop("receipt", None)
    if got and r.get("precision") == "bf16" or got == "float32" and name == "R2a":
        observed = {"logits" if framework == "torch" else "first activation": dtype_name(got)}
        out["receipt"] = {"claimed": "bf16", "observed": observed,
                          "where": "a side path (version-1 runs read the receipt outside the timed step)"}
    for k, gate in (("gate_max_abs_diff", "compiled vs eager logits"),
                    ("mirror_max_abs_diff", "checkpointed mirror"), ("mirror_rel_diff", "checkpointed mirror"),
                    ("parity_rel_diff", "jit vs op-by-op logits"), ("gate_loss_rel_diff", "loss over steps"),
                    ("lookup_rel_diff", "one-hot vs gather lookup")):
        if k in extra:
            out["gates"].append({"name": gate, "passed": True, "values": {k: extra.pop(k)},
                                 "tolerances": {}, "reference": "version-1 gate"})
    lg = extra.pop("loss_gate", None)
    if isinstance(lg, dict):
        out["gates"].append({"name": "loss over steps", "passed": True,
                             "values": {"max_abs_diff": max(lg.get("max_abs_diff", {0: 0}).values())},
                             "tolerances": {"atol": lg.get("atol")}, "reference": "the reference recipe"})
    prof = _profile(extra, steps)
    if prof is not None:
        out["profile"] = prof
    if "kernels" in extra:
        out["kernels"] = extra.pop("kernels")
    table = extra.pop("profile", None)
    if isinstance(table, str):
        extra["profile_table"] = table
    out["details"] = extra
    return out


def to_v2(data: dict, source: str) -> dict:
    fw = data.get("framework")
    if fw not in KEYS or not isinstance(data.get("rungs"), list):
        raise ResultsError(f"{source}: a version-1 file needs 'framework' (one of {tuple(KEYS)}) "
                           "and a 'rungs' list")
    config = data.get("config") or {}
    try:
        rungs = [_rung(r, fw, config) for r in data["rungs"]]
    except (KeyError, TypeError, AttributeError) as e:
        raise ResultsError(f"{source}: version-1 rung entries are malformed ({type(e).__name__}: {e})") from None
    peak = data.get("peak_tflops")
    if isinstance(peak, dict):
        peak = {k: v for k, v in peak.items() if k != "measured_bf16"}   # a literal, not a probe
    learning = data.get("learning")
    if isinstance(learning, dict):
        learning = {k: v for k, v in learning.items() if k != "passed"}
    return {"schema_version": 2, "framework": fw, "device": data.get("device", "?"),
            "config": config, "baseline": data.get("baseline", "R0"),
            "versions": data.get("versions", {}), "created": data.get("created", ""),
            "command": data.get("command", ""), "peak_tflops": peak, "roofs": None,
            "rungs": rungs, "learning": learning, "notes": data.get("notes", [])}
