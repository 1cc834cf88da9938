"""Links from a page's generated HTML to the glossary (``chapter13/glossary.md``), each term
linked once per page, where it first appears (framework-free).

``TERMS`` maps the words as the pages write them to the glossary's term; ``link_terms(html,
seen)`` links the first occurrence of each term not in ``seen`` (a page's set, updated) in the
text of ``html``, never inside a tag, a link, code or a fold's summary (a click there opens the
fold). The prose's own first mentions use MyST's ``{term}`` role in the notebooks' markdown.
"""
from __future__ import annotations

import re

GLOSSARY_PAGE = "../chapter13/glossary.html"      # from notebooks/*.html
TERMS = {
    # phrase as written (a regex, matched on word boundaries) -> the glossary's term
    r"did not settle|settled": "settled",
    r"spread": "spread",
    r"receipt": "receipt",
    r"MFU": "MFU",
    r"(?:fraction )?of the (?:measured )?matmul roof": "fraction of roof",
    r"planned temporaries": "planned temporaries",
    r"nvjet|splitK": "kernel names",
    r"gloo": "gloo-loopback",
    r"NVLS": "NVLS",
    r"busbw": "busbw",
    r"GSPMD": "GSPMD",
    r"donated": "donated",
    r"memory-bound": "memory-bound",
    r"host-bound": "host-bound",
    r"compute-bound": "compute-bound",
    r"roofline": "roofline",
    r"busy": "busy",
    r"dead end": "dead end",
}
CASE_SENSITIVE = {"MFU", "NVLS", "GSPMD", "busbw"}
_NO_LINK = ("a", "code", "summary", "pre", "script", "style")


def anchor(term: str) -> str:
    """The id Sphinx gives a glossary term: ``term-`` and the term, non-alphanumerics as hyphens."""
    return "term-" + re.sub(r"[^A-Za-z0-9]+", "-", term).strip("-")


def href(term: str) -> str:
    return f"{GLOSSARY_PAGE}#{anchor(term)}"


def _pattern(phrase: str, term: str) -> re.Pattern:
    flags = 0 if term in CASE_SENSITIVE else re.IGNORECASE
    return re.compile(rf"(?<![\w-])({phrase})(?![\w-])", flags)


PATTERNS = [(term, _pattern(p, term)) for p, term in TERMS.items()]


def link_terms(html: str, seen: set[str], seen_folded: set[str] | None = None) -> str:
    """``html`` with the first occurrence of each glossary term not in ``seen`` linked (and
    added to ``seen``). With ``seen_folded``, text inside a fold (``<details>``) keeps its own
    set: a term is linked once in the text a reader sees and once inside the folds, so a link
    spent in a fold never leaves the term's first visible use unlinked."""
    parts = re.split(r"(<[^>]+>)", html)
    open_tags: list[str] = []
    folds = 0
    for i, part in enumerate(parts):
        if part.startswith("<"):
            m = re.match(r"<(/?)([a-zA-Z0-9]+)", part)
            if m:
                name = m.group(2).lower()
                if name == "details":
                    folds += -1 if m.group(1) else 1
                if m.group(1):
                    if name in open_tags:
                        del open_tags[len(open_tags) - 1 - open_tags[::-1].index(name):]
                elif not part.endswith("/>") and name in _NO_LINK:
                    open_tags.append(name)
            continue
        if open_tags or not part.strip():
            continue
        used = seen_folded if (seen_folded is not None and folds > 0) else seen
        hits = []
        for term, pat in PATTERNS:
            m = None if term in used else pat.search(part)
            if m is not None and all(m.end() <= a or m.start() >= b for a, b, _ in hits):
                hits.append((m.start(), m.end(), term))
        for start, end, term in sorted(hits, reverse=True):
            used.add(term)
            part = (part[:start] + f'<a class="perfladder-term" href="{href(term)}">{part[start:end]}</a>'
                    + part[end:])
        parts[i] = part
    return "".join(parts)
