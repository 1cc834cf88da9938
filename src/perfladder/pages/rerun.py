"""What a page says about rungs run again (framework-free): a reader who runs a rung's cell a
second time sees the new rate beside the one it replaced, and every rung built on an earlier
version of it is marked, in its card, the table, the waterfall and the page's summary, until
its own cell runs again. The rule that sets the marks is ``perfladder.ladder.rerun``; the
entries carry them (``RungResult.built_on_earlier``, ``RungResult.replaces``)."""
from __future__ import annotations

from perfladder.results.record import LadderResult, RungResult
from perfladder.words import rate


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def replaced_text(r: RungResult) -> str:
    """'the version it replaced: 1,234 tokens/s' ('' for a rung run once)."""
    old = r.replaces
    if not old:
        return ""
    if old.get("tokens_per_s") is None:
        return f"the version it replaced was not measured ({old.get('outcome') or 'skipped'})"
    text = f"the version it replaced: {rate(old['tokens_per_s'])} tokens/s"
    if r.measured:
        text += f" (this one {r.tokens_per_s / old['tokens_per_s']:.2f}x that)"
    return text


def mark_text(r: RungResult) -> str:
    """'built on an earlier version of R1' ('' for an unmarked rung)."""
    return f"built on an earlier version of {_names(r.built_on_earlier)}" if r.built_on_earlier else ""


def line_note(r: RungResult) -> str:
    """What a rung's result line adds: the mark, and the rate of the version it replaced."""
    parts = [p for p in (mark_text(r), replaced_text(r)) if p]
    return f" [{'; '.join(parts)}]" if parts else ""


def card_rows(r: RungResult) -> list[tuple[str, str]]:
    """The rows a rung's card adds for a rung run again or built on one."""
    rows = []
    if r.built_on_earlier:
        rows.append(("built on", f"an earlier version of {_names(r.built_on_earlier)} (run again after "
                     "this rung ran), so it is not compared with it: run this rung's cell again to "
                     "measure it on the new one"))
    if r.replaces:
        rows.append(("run again", replaced_text(r)))
    return rows


def table_mark(r: RungResult) -> str:
    """The table's word for a marked rung, in place of a ratio read across versions."""
    return f"on an earlier {'/'.join(r.built_on_earlier)}" if r.built_on_earlier else ""


def bar_mark(r: RungResult) -> str:
    """The waterfall's word over a marked bar."""
    return f"on earlier\n{'/'.join(r.built_on_earlier)}" if r.built_on_earlier else ""


def compare_line(r: RungResult, reference: RungResult | None = None, where: str = "") -> str:
    """For a rung just run again: its new rate beside the one it replaced (and the reference
    run's rate for the same technique, on a smoke build)."""
    if not r.replaces or not (r.measured or r.replaces.get("tokens_per_s")):
        return ""
    now = f"{rate(r.tokens_per_s)} tokens/s" if r.measured else "not measured"
    line = f"Run again: {now} here; {replaced_text(r)}"
    if reference is not None and reference.measured:
        where = f" ({where})" if where else ""
        line += f"; the reference run{where}: {rate(reference.tokens_per_s)} tokens/s"
    return line + "."


def ladder_note(result: LadderResult) -> str:
    """The page's summary of rungs run again and of rungs built on earlier versions ('' when
    every rung ran once)."""
    again = [r.name for r in result.rungs if r.replaces]
    marked = [r for r in result.rungs if r.built_on_earlier]
    if not again and not marked:
        return ""
    out = []
    if again:
        out.append(f"Run again in this session: {_names(again)}.")
    if marked:
        out.append("Built on an earlier version of a rung run again after them, and not compared "
                   "with it: " + "; ".join(f"{r.name} (of {_names(r.built_on_earlier)})" for r in marked)
                   + ". Run their cells again to measure them on the new versions.")
    learning = result.learning
    conf = next((r for r in result.rungs if learning is not None and r.name == learning.configuration), None)
    if conf is not None and conf.built_on_earlier:
        out.append(f"The learning check trained {conf.name}'s configuration, {mark_text(conf)}.")
    return " ".join(out)
