"""The text a reader sees on a built page without opening anything (framework-free, stdlib).

``visible_text(html)``: the text of the page's article (``<article>``, else ``<main>``, else
the body), with every folded block (``<details>``: the evidence cards, the smoke checks, the
dropdowns and hidden cells of MyST) reduced to its one-line ``<summary>``; scripts, styles and
the sidebars are not text a reader reads. Whitespace runs count as one space.
``scripts/visible_text.py`` prints the count for built pages.
"""
from __future__ import annotations

import re
from html.parser import HTMLParser

HIDDEN = {"script", "style", "noscript", "template", "svg"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
ROOTS = ("article", "main", "body")


class _Visible(HTMLParser):
    """Collects the data of shown elements: inside the root, outside hidden tags, and inside a
    ``<details>`` only its ``<summary>``."""

    def __init__(self, root: str):
        super().__init__(convert_charrefs=True)
        self.root = root
        self.parts: list[str] = []
        self.stack: list[tuple[str, bool]] = []     # (tag, is its text shown?)

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        parent = self.stack[-1][1] if self.stack else False
        if tag == self.root and not any(t == self.root for t, _ in self.stack):
            shown = True
        elif tag in HIDDEN or tag == "details":
            shown = False
        elif tag == "summary" and self.stack and self.stack[-1][0] == "details":
            shown = len(self.stack) >= 2 and self.stack[-2][1]
        else:
            shown = parent
        self.stack.append((tag, shown))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):     # tolerate unclosed tags
            if self.stack[i][0] == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        if self.stack and self.stack[-1][1]:
            self.parts.append(data)


def visible_text(html: str) -> str:
    """The page's article text with every ``<details>`` reduced to its summary."""
    root = next((r for r in ROOTS if re.search(rf"<{r}[\s>]", html)), None)
    p = _Visible(root or "#none")
    if root is None:                                  # a fragment: all of it is the page
        p.stack.append(("#fragment", True))
    p.feed(html)
    return re.sub(r"\s+", " ", " ".join(p.parts)).strip()


def visible_chars(html: str) -> int:
    """How many characters ``visible_text`` leaves."""
    return len(visible_text(html))
