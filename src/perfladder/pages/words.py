"""Numbers as words moved to ``perfladder.words`` (the multi-GPU records format with them too,
below the page layer); this path keeps a user's import working."""
from perfladder.words import NONE, gbps, gib, ms, percent, rate, ratio, seconds, tflops  # noqa: F401
