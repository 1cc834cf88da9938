"""The JAX compiler's own accounting of a jitted step, read against the rate measured
(framework-free: the notebook cell asks the compiled program and hands the numbers here).

``compiled.cost_analysis()`` counts the FLOPs of the optimized program and
``compiled.memory_analysis()`` its buffers: the arguments (weights, optimizer state, the
batch), the outputs and the temporaries XLA plans. Beside them the page sets the matmul FLOPs
read off the traced program (``perfladder.jax.step.traced_flops``) and the model's formula
(``6N + 12LTD`` per token). On a GPU the optimized program hands its matmuls to cuBLAS custom
calls that ``cost_analysis`` does not count, which is why the ladder records the traced count;
on a CPU all three can be compared. Achieved TFLOP/s is a FLOP count over the measured step
time.
"""
from __future__ import annotations

from perfladder.pages.report import esc, table_html
from perfladder.results.record import LadderResult
from perfladder.words import gib, rate


def asked_rows(asked: dict) -> list[tuple[str, str]]:
    """What the compiled program said, per step: ``asked`` holds ``tokens``, ``cost_flops``
    (``cost_analysis()['flops']``, None when it gave none), ``traced_flops``, ``formula_flops``,
    ``temp_bytes``, ``argument_bytes``, ``output_bytes``."""
    t = asked["tokens"]

    def per(f):
        return "-" if f is None else f"{f:.3g} per step ({f / t:,.0f} per token)"
    out = [("cost_analysis() FLOPs", per(asked.get("cost_flops"))),
           ("matmul FLOPs in the traced program", per(asked.get("traced_flops"))),
           ("the formula 6N + 12LTD", per(asked.get("formula_flops")))]
    if asked.get("cost_flops") and asked.get("formula_flops"):
        out.append(("cost_analysis / formula", f"{asked['cost_flops'] / asked['formula_flops']:.2f}"))
    out += [("memory_analysis(): temporaries", gib(asked.get("temp_bytes"))),
            ("memory_analysis(): arguments", gib(asked.get("argument_bytes"))),
            ("memory_analysis(): outputs", gib(asked.get("output_bytes")))]
    return out


def recorded_rows(result: LadderResult, name: str) -> list[tuple[str, str]]:
    """What the shown run recorded for rung ``name`` from its compiled program, against its
    measured rate: the traced FLOPs per step, the achieved TFLOP/s they give, the model's
    TFLOP/s, the planned temporaries."""
    r = result.rung(name)
    d = r.details or {}
    out = [("measured rate", f"{rate(r.tokens_per_s)} tokens/s" if r.measured else "not measured")]
    if d.get("traced_flops_per_step") is not None:
        out.append(("traced matmul FLOPs per step", f"{d['traced_flops_per_step']:.3g}"))
    if d.get("traced_tflops") is not None:
        out.append(("achieved: traced FLOPs / measured step time", f"{d['traced_tflops']:.0f} TFLOP/s"))
    if r.tflops is not None:
        out.append(("achieved: model FLOPs (6N + 12LTD) / step time", f"{r.tflops:.0f} TFLOP/s"))
    if r.memory is not None and r.memory.bytes is not None:
        out.append((r.memory.kind, gib(r.memory.bytes)))
    return out


def html(asked: dict | None, asked_label: str, result: LadderResult | None, name: str, shown_label: str) -> str:
    """Two small tables: what this build's compiled step said (``asked_label`` says which
    model and where; left out when ``asked`` is None), and what the shown run recorded for
    ``name`` (left out when ``result`` is None)."""
    def tab(rows):
        return table_html(["", ""], [[esc(k), esc(v)] for k, v in rows], cls="perfladder-table perfladder-compact")
    out = "" if asked is None else f"<p><strong>{esc(asked_label)}</strong></p>" + tab(asked_rows(asked))
    if result is not None:
        out += f"<p><strong>{esc(shown_label)}</strong></p>" + tab(recorded_rows(result, name))
    return out


def text(asked: dict, asked_label: str, result: LadderResult | None, name: str, shown_label: str) -> str:
    lines = [asked_label] + [f"  {k}: {v}" for k, v in asked_rows(asked)]
    if result is not None:
        lines += [shown_label] + [f"  {k}: {v}" for k, v in recorded_rows(result, name)]
    return "\n".join(lines)
