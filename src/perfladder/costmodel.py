"""The data-parallel cost model: moved to ``perfladder.multigpu.costmodel``; its names stay
importable from here."""
from perfladder.multigpu.costmodel import (  # noqa: F401
    GRAD_BYTES_PER_PARAM,
    LINK_NAMES,
    LINKS,
    PREDICT_KS,
    SCOPES,
    Estimate,
    Link,
    announce,
    ceiling_tokens_per_s,
    get_link,
    hierarchical_allreduce_seconds,
    predict,
    predict_hierarchical,
    prediction,
    predictions,
    ring_allreduce_seconds,
    scaling_curve,
)
