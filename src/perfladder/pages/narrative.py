"""The two sentences a page may generate about a run: they are true in every case they are
used, because they only restate what was recorded (framework-free).

* ``smoke_check(rung)``: what a live smoke run of a rung did (it ran, its gates, receipt,
  compile, windows) -- a check of the code, never a number to read;
* ``learning_text(check)``: a learning check's numbers and whether it passed;
* ``smoke_summary(what, device)``: the one line a folded smoke check shows, labelled as no result.

Every other sentence of the pages is the authors' prose, with numbers inserted and claims
checked against the run shown (``perfladder.pages.story``).
"""
from __future__ import annotations

from perfladder.results.record import RungResult


def smoke_check(r: RungResult) -> str:
    """One line for the live smoke run of a rung: it ran, its gates, receipt, compile, windows."""
    if not r.measured:
        return f"{r.name} ({r.label}) did not run here: {r.error or '; '.join(r.notes)}"
    parts = [f"{r.name} ({r.label}) ran"]
    if r.gates:
        ok = sum(g.passed for g in r.gates)
        parts.append(f"{ok} of {len(r.gates)} gate(s) passed ({', '.join(g.name for g in r.gates)})")
    if r.receipt is not None:
        seen = ", ".join(f"{k} {v}" for k, v in r.receipt.observed.items())
        verdict = "matches" if r.receipt.ok else "does not match"
        parts.append(f"receipt {seen} ({verdict} {r.receipt.claimed})")
    if r.compile is not None:
        parts.append(f"first call {r.compile.first_call_s:.1f} s")
    if r.timing is not None:
        parts.append(f"{len(r.timing.windows)} timed windows")
    return ", ".join(parts)


SMOKE_LABEL = "smoke check, not a performance number"


def smoke_summary(what: str, device: str) -> str:
    """The one visible line of a folded smoke check: what ran ("" for a rung's own cell), where,
    and that it is no result."""
    return f"{what + ': ' if what else ''}{SMOKE_LABEL} ({device})"


def learning_text(check) -> str:
    if check is None:
        return "No learning check was recorded."
    who = f"{check.configuration}'s" if check.configuration else "The fastest"
    out = (f"{who} configuration trained {check.steps} steps from a fresh "
           f"initialisation: mean training loss {check.first:.3f} over the first {check.window} steps, "
           f"{check.last:.3f} over the last {check.window}")
    if check.val_after is not None:
        out += f"; validation loss {check.val_before:.3f} -> {check.val_after:.3f}"
    return out + (". Passed: it learns." if check.passed else ". FAILED: it does not learn.")
