"""The learning check as a picture (framework-free): the training loss of every step, the
validation loss before and after training (the check's two points, computed by the plain
fp32 model with the trained weights) and the threshold the validation loss must end under."""
from __future__ import annotations

from perfladder.pages.plot import PAGE_WIDTH_IN

LOSS_COLOR, VAL_COLOR, THRESHOLD_COLOR = "#1f77b4", "#d62728", "#444444"


def figure(check, title: str):
    """``check``: a ``LearningCheck`` with ``losses``; ``title``: which run and configuration."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH_IN * 0.8, 2.9), layout="constrained")
    ax.plot(range(1, len(check.losses) + 1), check.losses, linewidth=1, color=LOSS_COLOR,
            label="training loss, every step", gid="train")
    if check.val_before is not None and check.val_after is not None:
        ax.plot([0, check.steps], [check.val_before, check.val_after], linestyle="none", marker="o",
                color=VAL_COLOR, label="validation loss, before and after", gid="val")
        for x, y in ((0, check.val_before), (check.steps, check.val_after)):
            ax.annotate(f"{y:.3f}", (x, y), xytext=(4, 4), textcoords="offset points", fontsize=6.5,
                        color=VAL_COLOR)
    if check.threshold is not None:
        ax.axhline(check.threshold, color=THRESHOLD_COLOR, linestyle="--", linewidth=1,
                   label=f"the check: validation loss must end under {check.threshold:.3f}", gid="threshold")
    ax.set_xlabel("step", fontsize=8)
    ax.set_ylabel("loss (cross-entropy, nats)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_title(title, fontsize=8.5)
    ax.legend(fontsize=6.5, frameon=False, loc="upper right")
    ax.spines[["top", "right"]].set_visible(False)
    return fig
