#!/usr/bin/env python
"""Characters of text a reader sees on built pages without opening a fold.

    .venv/bin/python scripts/visible_text.py [HTML ...]

Default: the two ladder pages of _build/html (PERFLADDER_BOOK_HTML overrides the folder). Per
page: the visible characters (``perfladder.pages.visible``: the article's text, every
``<details>`` reduced to its summary) and the whole article's for scale.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from perfladder.pages.visible import visible_chars, visible_text


def main(argv: list[str]) -> int:
    html = Path(os.environ.get("PERFLADDER_BOOK_HTML", "_build/html"))
    pages = [Path(a) for a in argv] or [html / "notebooks" / f"{n}.html"
                                        for n in ("01_pytorch_ladder", "02_jax_ladder")]
    missing = [str(p) for p in pages if not p.is_file()]
    if missing:
        print(f"visible_text: no such page: {', '.join(missing)} (build the book first)", file=sys.stderr)
        return 2
    for p in pages:
        text = p.read_text(encoding="utf-8")
        everything = visible_text(text.replace("<details", "<div").replace("</details>", "</div>"))
        print(f"{p}: {visible_chars(text):,} visible characters ({len(everything):,} with every fold open)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
