"""The waterfall and the side-by-side chart: moved to ``perfladder.pages.plot``; these names stay
importable from here."""
from perfladder.pages.plot import (  # noqa: F401
    FRAMEWORK_COLORS,
    bar_colors,
    bar_label,
    compare,
    comparison_table,
    waterfall,
)
