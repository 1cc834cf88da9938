"""Model and ladder configuration, shared by both frameworks (no framework imports).

Two ladder presets:

* ``full``  -- the chapter's sizes: width 512, 6 blocks, 8 heads, context 128,
  batch 64 then 512. Meant for a GPU.
* ``smoke`` -- a tiny model and a handful of steps, so that every rung (every code
  path) runs on two CPU cores in seconds. Its numbers are *not* performance results.

``pick_config()`` chooses ``full`` when a GPU is present and ``smoke`` otherwise,
unless the caller or ``$PERFLADDER_CONFIG`` names one; it always says which.
"""
from __future__ import annotations

import dataclasses
import numbers
import os
from dataclasses import dataclass

from perfladder.checks import check_int, check_positive
from perfladder.measure.timing import DEFAULT_TARGET_SPREAD

POSITIONS = ("rope", "learned")


@dataclass(frozen=True)
class GPTConfig:
    """Architecture of the GPT (identical in both frameworks)."""
    vocab_size: int = 28
    num_hiddens: int = 512
    num_blks: int = 6
    num_heads: int = 8
    max_len: int = 1024          # only used by pos='learned'
    pos: str = "rope"
    ffn_mult: int = 4
    ln_eps: float = 1e-5         # torch's default; set explicitly on the flax side too
    rope_base: float = 10000.0

    def __post_init__(self):
        if self.pos not in POSITIONS:
            raise ValueError(f"pos={self.pos!r} is not valid; valid choices: {POSITIONS}")
        for name in ("vocab_size", "num_hiddens", "num_blks", "num_heads", "max_len", "ffn_mult"):
            check_int(name, getattr(self, name))
        for name in ("ln_eps", "rope_base"):
            check_positive(name, getattr(self, name))
        if self.num_hiddens % self.num_heads:
            raise ValueError(f"num_hiddens={self.num_hiddens} is not divisible by "
                             f"num_heads={self.num_heads}")
        if self.pos == "rope" and (self.num_hiddens // self.num_heads) % 2:
            raise ValueError(f"RoPE needs an even head width; got {self.num_hiddens // self.num_heads}")

    @property
    def head_dim(self) -> int:
        return self.num_hiddens // self.num_heads


def gpt_config(config, **arch) -> GPTConfig:
    """What both ``GPT`` constructors are built from: ``config`` itself if it is a
    ``GPTConfig``, else the chapter's call ``GPT(vocab_size, num_hiddens=512, num_blks=6)``
    turned into one (``GPTConfig(vocab_size=..., **arch)``), so both spellings build the
    same model."""
    fields = tuple(f for f in GPTConfig.__dataclass_fields__ if f != "vocab_size")
    if isinstance(config, GPTConfig):
        if arch:
            raise TypeError(f"pass either a GPTConfig or a vocab_size with keywords, not both "
                            f"(got a GPTConfig and {', '.join(sorted(arch))})")
        return config
    if isinstance(config, bool) or not isinstance(config, numbers.Integral):
        raise TypeError(f"config must be a perfladder.config.GPTConfig or a vocab_size (int), "
                        f"got {type(config).__name__} {config!r}")
    unknown = sorted(set(arch) - set(fields))
    if unknown:
        raise TypeError(f"unknown GPT argument(s) {', '.join(unknown)}; valid choices: "
                        f"{', '.join(fields)}")
    return GPTConfig(vocab_size=int(config), **arch)


def expected_num_params(cfg: GPTConfig) -> int:
    """Parameter count from the architecture alone (used to check the models).

    Per block: fused QKV (D x 3D + 3D), output projection (D x D + D),
    FFN (D x mD + mD + mD x D + D), two LayerNorms (4D). Plus the token
    embedding (V x D, tied with the output layer), the final LayerNorm (2D),
    and a learned position table (max_len x D) when ``pos='learned'``.
    """
    D, m = cfg.num_hiddens, cfg.ffn_mult
    block = (3 * D * D + 3 * D) + (D * D + D) + (D * m * D + m * D) + (m * D * D + D) + 4 * D
    total = cfg.num_blks * block + cfg.vocab_size * D + 2 * D
    if cfg.pos == "learned":
        total += cfg.max_len * D
    return total


def flops_per_token(num_params: int, num_blks: int, seq_len: int, num_hiddens: int) -> int:
    """Training FLOPs per token: ``6 N + 12 L T D``.

    ``6N``: every parameter takes part in one multiply-add (2 FLOPs) in the forward
    pass and two in the backward pass (gradient w.r.t. input and w.r.t. weight).
    ``12 L T D``: attention's two T x T products per layer (scores QK^T and the
    weighted sum AV), 2 T D FLOPs each per token forward, times 3 for forward+backward.
    Causal masking is not subtracted (the usual PaLM / nanoGPT convention).
    """
    return 6 * num_params + 12 * num_blks * seq_len * num_hiddens


@dataclass(frozen=True)
class LadderConfig:
    """Sizes and step counts of one ladder run."""
    name: str
    num_hiddens: int
    num_blks: int
    num_heads: int
    num_steps: int        # context length T
    batch_size: int       # the seed's batch (R0-R2)
    big_batch: int        # the batch-up rung (R3 onwards)
    warmup: int           # steps before the first timed window
    timed: int            # steps per timed window
    windows: int          # timed windows; the median is reported
    eager_timed: int      # JAX's un-jitted R0 is measured briefly
    learn_steps: int      # the learning check
    num_train: int = 10000
    num_val: int = 5000
    learn_num_train: int = 10000  # training windows of the learning check (validation follows them)
    target_spread: float = DEFAULT_TARGET_SPREAD   # windows settled within this (max-min)/median
    max_windows: int = 12         # give up settling after this many windows (then: unstable)
    # wall seconds of timed windows per measurement after which no window is opened (and no
    # second attempt made once half is spent): what bounds a rung whose windows wander
    timing_budget_s: float | None = None
    # the longest a timed window should take: a rung whose ``timed`` steps would take longer
    # times fewer per window (``perfladder.measure.timing.measure``), never fewer than 2
    window_s: float | None = None
    lr: float = 1e-3
    seed: int = 0

    def gpt(self, vocab_size: int = 28, **overrides) -> GPTConfig:
        kw = dict(vocab_size=vocab_size, num_hiddens=self.num_hiddens,
                  num_blks=self.num_blks, num_heads=self.num_heads,
                  max_len=max(self.num_steps, 128))
        kw.update(overrides)
        return GPTConfig(**kw)

    def timed_steps(self, batch_size: int) -> int:
        """Steps per timed window: ``timed`` up to the big batch, fewer beyond it so that a
        window holds about as many tokens (never fewer than 2)."""
        return self.timed if batch_size <= self.big_batch else max(2, round(self.timed * self.big_batch / batch_size))

    def warmup_steps(self, batch_size: int) -> int:
        """Steps before the first window: ``warmup`` up to the big batch, fewer beyond it by the
        same rule (the compile happened in the first call, before; what is warmed past here is
        allocator growth and clocks, which scale with tokens, not steps); never fewer than
        ``min(warmup, 5)``."""
        if batch_size <= self.big_batch:
            return self.warmup
        return max(min(self.warmup, 5), round(self.warmup * self.big_batch / batch_size))

    def replace(self, **changes) -> "LadderConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def is_smoke(self) -> bool:
        return self.name == "smoke"


PRESETS = {
    "full": LadderConfig(name="full", num_hiddens=512, num_blks=6, num_heads=8,
                         num_steps=128, batch_size=64, big_batch=512,
                         warmup=30, timed=40, windows=3, eager_timed=3,
                         # 200 steps: on the H200 runs both frameworks' training loss is down
                         # to 1.9 there (2.2 at 150), half a nat under the 2.40 threshold (frozen
                         # blocks: 2.65, measure/learning.py); 300 added 10 s a framework
                         learn_steps=200, max_windows=8, timing_budget_s=6.0, window_s=1.0,
                         # 200 steps of batch 2048 would see the d2l split of 10,000 windows
                         # ~40 times over: memorised, not learned. Train the check on most of
                         # the book and judge it on the windows after.
                         learn_num_train=150_000),
    "smoke": LadderConfig(name="smoke", num_hiddens=32, num_blks=2, num_heads=2,
                          num_steps=16, batch_size=8, big_batch=32,
                          warmup=2, timed=3, windows=3, eager_timed=2,
                          learn_steps=150, num_train=2000, num_val=200, lr=3e-3,
                          learn_num_train=2000,
                          # CPU smoke numbers are noise by nature: settle loosely, give up early
                          target_spread=0.3, max_windows=5),
}
CONFIG_NAMES = tuple(PRESETS)


def get_config(name: str) -> LadderConfig:
    """The preset called ``name``; a clear error for anything else."""
    if name not in PRESETS:
        raise ValueError(f"unknown config {name!r}; valid choices: {CONFIG_NAMES}")
    return PRESETS[name]


def pick_config(name: str | None = None, has_gpu: bool | None = None,
                verbose: bool = True) -> LadderConfig:
    """``name`` if given, else ``$PERFLADDER_CONFIG``, else ``full`` on a GPU, ``smoke`` on CPU."""
    source = "argument"
    if name is None:
        name = os.environ.get("PERFLADDER_CONFIG")
        # scripts/build_book.sh says why it chose the config it exports
        why = os.environ.get("PERFLADDER_CONFIG_SOURCE")
        source = (f"$PERFLADDER_CONFIG={name!r}" + (f", {why}" if why else "")
                  if name and name not in PRESETS else why or "$PERFLADDER_CONFIG")
    if not name:
        if has_gpu is None:
            has_gpu = gpu_present()
        name, source = ("full" if has_gpu else "smoke"), ("GPU found" if has_gpu else "no GPU found")
    try:
        cfg = get_config(name)
    except ValueError as e:
        raise ValueError(f"{e} (from {source})") from None
    if verbose:
        print(f"perfladder config: {cfg.name} ({source})"
              + ("  -- smoke numbers are NOT performance results" if cfg.is_smoke else ""))
    return cfg


def gpu_present() -> bool:
    """Is there a CUDA GPU? Asks whichever framework is already imported, else nvidia-smi."""
    import sys

    from perfladder.hardware import nvidia_smi
    if "torch" in sys.modules:
        return bool(sys.modules["torch"].cuda.is_available())
    if "jax" in sys.modules:
        try:
            return any(d.platform == "gpu" for d in sys.modules["jax"].devices())
        except RuntimeError:
            return False
    return "GPU" in (nvidia_smi("-L", timeout=20) or "")
