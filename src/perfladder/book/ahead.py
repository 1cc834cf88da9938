"""Moved to ``perfladder.ahead.book`` (the compile-ahead annex lives behind one door,
``perfladder.ahead``); these names stay importable from here, and
``python -m perfladder.book.ahead`` still runs the stage."""
import sys

from perfladder.ahead.book import ENOUGH, FRAMEWORKS, GRACE_S, JAX_RESERVE_BYTES, main, one, run  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
