"""The GPT of the ladder, in PyTorch, built part by part (nanoGPT-style).

Parameter names follow CONTRIBUTING.md exactly, because ``perfladder.parity`` copies
weights across frameworks by name:

    token_emb, pos_emb (pos='learned' only), blks[i].norm1/.norm2,
    blks[i].attn.W_qkv/.W_o, blks[i].ffn.dense1/.dense2, norm

Shapes: B batch, T time (context), D width (num_hiddens), H heads, Dh = D // H, V vocab.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from perfladder.config import GPTConfig, gpt_config
from perfladder.config import flops_per_token as _flops_per_token
from perfladder.torch.fused import check_fused

# Which scaled-dot-product-attention kernel to pin (None: let PyTorch choose).
ATTN_BACKENDS = {
    None: None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def check_attn_backend(name):
    """Return the ``SDPBackend`` for ``name``; a clear error for anything unknown."""
    if name not in ATTN_BACKENDS:
        raise ValueError(f"attn_backend={name!r} is not valid; valid choices: {list(ATTN_BACKENDS)}")
    return ATTN_BACKENDS[name]


# How the token embedding is computed (the parameter is ``token_emb.weight`` either way).
EMBEDS = ("gather", "onehot")


def check_embed(name) -> str:
    if name not in EMBEDS:
        raise ValueError(f"embed={name!r} is not valid; valid choices: {EMBEDS}")
    return name


# Token ids nn.Embedding and one_hot take.
ID_DTYPES = (torch.int64, torch.int32)


def check_token_ids(X, vocab_size: int) -> None:
    """Token ids of shape (batch, seq_len), integers, every id in [0, vocab_size): one
    ValueError naming what is wrong and what is valid otherwise.

    Shape and dtype are metadata, so they are checked always (under torch.compile once, at
    trace time). The range needs the values: it is read from a CPU tensor outside
    compilation only. On a GPU reading it would cost a device sync in every forward, which
    would change what the ladder times; there the embedding kernel's own device-side assert
    stops an out-of-range id (never a silent wrong row).
    """
    if not isinstance(X, torch.Tensor):
        raise TypeError(f"token ids must be a torch.Tensor of shape (batch, seq_len), got {type(X).__name__}")
    if X.dim() != 2:
        raise ValueError(f"token ids must have shape (batch, seq_len); got shape {tuple(X.shape)}")
    if X.dtype not in ID_DTYPES:
        raise ValueError(f"token ids must be integers; got dtype {X.dtype}, valid: "
                         f"{', '.join(map(str, ID_DTYPES))}")
    if X.numel() == 0:
        raise ValueError(f"token ids of shape {tuple(X.shape)} hold no tokens; give at least one")
    if X.device.type == "cpu" and not torch.compiler.is_compiling():
        lo, hi = int(X.min()), int(X.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"token id {lo if lo < 0 else hi} is out of range: valid ids are "
                             f"0 to {vocab_size - 1} (vocab_size={vocab_size})")
# The dtype of the residual stream H between blocks (see GPT).
RESIDUALS = ("fp32", "bf16")


def check_residual(name) -> str:
    if name not in RESIDUALS:
        raise ValueError(f"residual={name!r} is not valid; valid choices: {RESIDUALS}")
    return name


# -- 1. rotary position embedding ----------------------------------------------------------
def rope_angles(T: int, head_dim: int, base: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for positions 0..T-1, shape (T, Dh), always fp32.

    Frequency i (0 <= i < Dh/2) is base^(-2i/Dh); the table repeats the Dh/2 angles
    twice along the last axis, matching the rotate-half pairing (x_i with x_{i+Dh/2}).
    """
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    pos = torch.arange(T, device=device, dtype=torch.float32)
    angles = pos[:, None] * inv_freq[None, :]                     # (T, Dh/2)
    angles = torch.cat([angles, angles], dim=-1)                  # (T, Dh)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last axis."""
    x1, x2 = x.chunk(2, dim=-1)                                   # (..., Dh/2) each
    return torch.cat([-x2, x1], dim=-1)                           # (..., Dh)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate q or k of shape (B, T, H, Dh) by (T, Dh) tables; fp32 inside, x's dtype out."""
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]       # (1, T, 1, Dh)
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)        # (B, T, H, Dh)


def apply_rope(x: torch.Tensor, base: float) -> torch.Tensor:
    """RoPE on (B, T, H, Dh) with tables computed on the spot (the reference for ``RoPE``)."""
    return rotate(x, *rope_angles(x.shape[1], x.shape[3], base, x.device))


class RoPE(nn.Module):
    """Rotary embedding with its cos/sin tables built once, for ``max_len`` positions.

    The tables are fp32 buffers that are neither parameters nor saved in the state dict.
    Computing them inside ``forward`` instead lets inductor fuse the trigonometry into
    the elementwise kernel that applies it, i.e. recompute cos/sin for every element of
    q and k (B*H times more work than the table), which made that kernel and its backward
    one of the largest in the step. Longer sequences than ``max_len`` still work: their
    tables are computed on the spot.
    """

    def __init__(self, head_dim: int, max_len: int, base: float):
        super().__init__()
        self.base = base
        cos, sin = rope_angles(max_len, head_dim, base, device="cpu")   # (max_len, Dh) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def tables(self, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The (T, Dh) fp32 cos and sin tables for positions 0..T-1."""
        if T > self.cos.shape[0]:
            return rope_angles(T, self.cos.shape[1], self.base, device)
        return self.cos[:T], self.sin[:T]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rotate(x, *self.tables(x.shape[1], x.device))     # (B, T, H, Dh)


# -- 2. causal self-attention --------------------------------------------------------------
class CausalAttention(nn.Module):
    """``fused_rope``: split the projection into heads and rotate q and k in one Triton kernel
    each way (``fused.rope``) instead of the split + ``RoPE`` ops. ``fused_attention``: the
    split, RoPE, SDPA and the merge of the heads in one Triton kernel each way
    (``fused.attention``), from the projection's (B, T, 3D) output to ``W_o``'s (B, T, D) input."""

    def __init__(self, config: GPTConfig, attn_backend=None, fused_rope: bool = False,
                 fused_attention: bool = False):
        super().__init__()
        for name, on in (("rope", fused_rope), ("attention", fused_attention)):
            if on and config.pos != "rope":
                raise ValueError(f"fused {name!r} needs pos='rope'; this config has pos={config.pos!r}")
        if fused_attention and attn_backend is not None:
            raise ValueError(f"fused 'attention' replaces SDPA, so attn_backend must be None; "
                             f"got attn_backend={attn_backend!r}")
        self.fused_rope, self.fused_attention = bool(fused_rope), bool(fused_attention)
        D = config.num_hiddens
        self.num_heads = config.num_heads
        self.rope = (RoPE(config.head_dim, config.max_len, config.rope_base)
                     if config.pos == "rope" else None)
        self.backend = check_attn_backend(attn_backend)
        self.W_qkv = nn.Linear(D, 3 * D, bias=True)
        self.W_o = nn.Linear(D, D, bias=True)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        B, T, D = X.shape
        H = self.num_heads
        if self.fused_attention:
            from perfladder.torch.fused.attention import rope_attention
            cos, sin = self.rope.tables(T, X.device)              # (T, Dh) fp32 each
            return self.W_o(rope_attention(self.W_qkv(X), cos, sin, H))  # (B, T, 3D) -> (B, T, D)
        if self.fused_rope:
            from perfladder.torch.fused.rope import rope_qkv
            cos, sin = self.rope.tables(T, X.device)              # (T, Dh) fp32 each
            q, k, v = rope_qkv(self.W_qkv(X), cos, sin, H)        # (B, T, H, Dh) each
        else:
            q, k, v = self.W_qkv(X).split(D, dim=-1)              # (B, T, D) each
            q, k, v = (u.reshape(B, T, H, D // H) for u in (q, k, v))  # (B, T, H, Dh)
            if self.rope is not None:
                q, k = self.rope(q), self.rope(k)                 # (B, T, H, Dh), fp32 inside
        q, k, v = (u.transpose(1, 2) for u in (q, k, v))          # (B, H, T, Dh)
        scale = 1.0 / math.sqrt(D // H)
        if self.backend is None:
            Y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:
            with sdpa_kernel(self.backend):
                Y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        Y = Y.transpose(1, 2).reshape(B, T, D)                    # (B, H, T, Dh) -> (B, T, D)
        return self.W_o(Y)


# -- 3. feed-forward -----------------------------------------------------------------------
class FFN(nn.Module):
    """GELU both ways, by ``fused`` option: ``fused_gelu`` in Triton kernels (``fused.gelu``),
    ``fused_mlp`` in Triton GEMMs (``fused.mlp``), ``epilogue`` in cuBLASLt's (``fused.epilogue``)."""

    def __init__(self, config: GPTConfig, fused_gelu=False, fused_mlp=False, epilogue=False):
        super().__init__()
        D, m = config.num_hiddens, config.ffn_mult
        self.fused_gelu, self.fused_mlp, self.epilogue = bool(fused_gelu), bool(fused_mlp), bool(epilogue)
        self.dense1, self.dense2 = nn.Linear(D, m * D, bias=True), nn.Linear(m * D, D, bias=True)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if self.epilogue:
            from perfladder.torch.fused.epilogue import fused_ffn as cublaslt_ffn
            return cublaslt_ffn(X, self.dense1, self.dense2)             # (B, T, D)
        if self.fused_mlp:
            from perfladder.torch.fused.mlp import fused_ffn
            return fused_ffn(X, self.dense1, self.dense2)                # (B, T, D)
        if self.fused_gelu:
            from perfladder.torch.fused.gelu import gelu_tanh
            return self.dense2(gelu_tanh(self.dense1(X)))        # (B, T, D)
        return self.dense2(F.gelu(self.dense1(X), approximate="tanh"))  # (B, T, D)


def norm_out_dtype(H: torch.Tensor) -> torch.dtype:
    """What a fused LayerNorm writes: the autocast dtype when autocast is on (the reference
    LayerNorm computes in fp32 and the next matmul casts to it), else the stream's dtype."""
    dev = H.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else H.dtype


def fused_norm(norm: nn.LayerNorm, H: torch.Tensor, pending: torch.Tensor | None):
    """``(H + pending, norm(H + pending))`` through the fused kernels (``pending=None``: no add)."""
    from perfladder.torch.fused.add_layer_norm import add_layer_norm, layer_norm
    dt = norm_out_dtype(H)
    if pending is None:
        return H, layer_norm(H, norm.weight, norm.bias, norm.eps, dt)
    return add_layer_norm(H, pending, norm.weight, norm.bias, norm.eps, dt)


# -- 4. one pre-norm block -----------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, config: GPTConfig, attn_backend=None, fused: tuple = (),
                 residual: str = "fp32"):
        super().__init__()
        D = config.num_hiddens
        self.norm1 = nn.LayerNorm(D, eps=config.ln_eps)
        self.attn = CausalAttention(config, attn_backend, fused_rope="rope" in fused,
                                    fused_attention="attention" in fused)
        self.norm2 = nn.LayerNorm(D, eps=config.ln_eps)
        self.ffn = FFN(config, "gelu" in fused, "mlp" in fused, "epilogue" in fused)
        self.residual = residual

    def _norm(self, norm: nn.LayerNorm, H: torch.Tensor) -> torch.Tensor:
        # bf16 stream: autocast runs LayerNorm in fp32 and returns fp32; its output is rounded
        # to the stream's bf16 here (the next matmul would round it so anyway)
        y = norm(H)
        return y.to(H.dtype) if self.residual == "bf16" else y

    def forward(self, H: torch.Tensor) -> torch.Tensor:
        H = H + self.attn(self._norm(self.norm1, H))              # (B, T, D)
        return H + self.ffn(self._norm(self.norm2, H))            # (B, T, D)

    def forward_addnorm(self, H: torch.Tensor, pending: torch.Tensor | None):
        """The block with each residual add fused into the LayerNorm after it: input ``H +
        pending`` (None: ``H``), output ``(H, ffn output)`` in the same form, so the FFN's add
        happens in the next block's first (or the final) fused LayerNorm."""
        H, y = fused_norm(self.norm1, H, pending)                 # (B, T, D) each
        H, y = fused_norm(self.norm2, H, self.attn(y))
        return H, self.ffn(y)


# -- 5. activation checkpointing (rung R4's technique) ----------------------------------------
def checkpoint_block(block, *inputs):
    """R4: run one block keeping only its inputs; the backward pass
    recomputes the rest."""
    return checkpoint(block, *inputs, use_reentrant=False)


# -- 6. the model ----------------------------------------------------------------------------
class GPT(nn.Module):
    """Decoder-only Transformer with tied input/output embeddings. ``GPT(cfg)``, or the
    chapter's ``GPT(vocab_size, num_hiddens=512, num_blks=6)`` (any ``GPTConfig`` field).

    ``attn_backend``: None (PyTorch picks) or a key of ``ATTN_BACKENDS`` pinned by ``sdpa_kernel``.
    ``checkpoint=True``: every block through ``checkpoint_block`` (recomputed in the backward).
    ``embed``: 'gather' (``nn.Embedding``) or 'onehot' (``one_hot(X) @ W`` in fp32, see
    ``embed_tokens``): the same parameter and rows, a different gradient kernel.
    ``fused``: Triton kernels in place of reference ops (the options and what each subsumes:
    ``perfladder.torch.fused``); the parameters and the math are the same.
    ``residual``: the residual stream's dtype between blocks. 'fp32' (default): H stays fp32
    under bf16 autocast. 'bf16' is **a numerics change**: H is rounded to bf16 after the
    embedding and at every residual add (its gradient too); LayerNorm keeps fp32 statistics
    and writes bf16. It halves the stream's bytes and needs bf16 autocast around the forward.
    """

    def __init__(self, config: GPTConfig | int, attn_backend=None, checkpoint: bool = False,
                 embed: str = "gather", fused: tuple = (), residual: str = "fp32", **arch):
        super().__init__()
        config = gpt_config(config, **arch)   # GPT(cfg) or the chapter's GPT(vocab_size, num_hiddens=...)
        check_attn_backend(attn_backend)
        self.config = config
        self.attn_backend = attn_backend
        # True: every block through ``checkpoint_block``; a function: through that one instead
        # (a reader's own version of the technique, ``LadderRun.run("R4", checkpoint_block=...)``)
        self.run_block = checkpoint_block if checkpoint is True else checkpoint or None
        if self.run_block is not None and not callable(self.run_block):
            raise ValueError(f"checkpoint={checkpoint!r} must be True, False or a function "
                             "run_block(block, *inputs)")
        self.embed = check_embed(embed)
        self.fused = check_fused(fused)
        self.residual = check_residual(residual)
        if self.fused:
            from perfladder.torch.fused.gemm import routed_linear
        self.pos = config.pos
        D = config.num_hiddens
        self.token_emb = nn.Embedding(config.vocab_size, D)
        if config.pos == "learned":
            self.pos_emb = nn.Embedding(config.max_len, D)
        self.blks = nn.ModuleList(Block(config, attn_backend, self.fused, self.residual)
                                  for _ in range(config.num_blks))
        self.norm = nn.LayerNorm(D, eps=config.ln_eps)
        self.apply(self._init_weights)
        self._linear = routed_linear(self) if self.fused else F.linear   # the LM head's (fused 'gemm')

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # normal(0, 0.02) weights, zero biases (LayerNorms keep ones / zeros); deterministic given the seed
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def embed_tokens(self, X: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> embeddings (B, T, D), fp32 (autocast does not touch either path).

        ``'gather'`` reads rows of the table; its gradient is a scatter-add of all B*T
        output gradients into the V rows (atomics, thousands of updates per row when V=28).
        ``'onehot'`` multiplies a one-hot matrix by the table: the same rows, exactly, in
        true fp32 (every output is 1*w plus zeros); its gradient ``one_hot(X)^T @ dH`` is a
        matmul. Its cost is 2*V*D FLOPs per token, nothing next to the model's 6N. On CUDA
        with TF32 matmuls allowed, the product rounds the table to TF32 (10-bit mantissa),
        finer than the bf16 that autocast gives every other matmul.
        """
        if self.embed == "gather":
            return self.token_emb(X)                              # (B, T, D)
        W = self.token_emb.weight                                 # (V, D)
        with torch.autocast(X.device.type, enabled=False):
            onehot = F.one_hot(X, W.shape[0]).to(W.dtype)         # (B, T, V)
            return onehot @ W                                     # (B, T, V) @ (V, D) -> (B, T, D)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> logits (B, T, V)."""
        check_token_ids(X, self.config.vocab_size)
        T = X.shape[1]
        H = self.embed_tokens(X)                                  # (B, T, D)
        if self.pos == "learned":
            if T > self.config.max_len:
                raise ValueError(f"sequence length {T} exceeds max_len={self.config.max_len}")
            H = H + self.pos_emb(torch.arange(T, device=X.device))  # (B, T, D) + (T, D)
        if self.residual == "bf16":
            H = self._bf16_stream(H)                              # (B, T, D) bf16
        if "addnorm" in self.fused:
            return self._forward_addnorm(H)
        for blk in self.blks:
            H = blk(H) if self.run_block is None else self.run_block(blk, H)   # (B, T, D)
        return self._linear(self.norm(H), self.token_emb.weight)      # (B, T, D) @ (D, V) -> (B, T, V)

    @staticmethod
    def _bf16_stream(H: torch.Tensor) -> torch.Tensor:
        dev = H.device.type
        if not (torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) == torch.bfloat16):
            raise RuntimeError("residual='bf16' needs bf16 autocast around the forward "
                               "(torch.autocast(device_type, dtype=torch.bfloat16)); it is off here")
        return H.to(torch.bfloat16)

    def _forward_addnorm(self, H: torch.Tensor) -> torch.Tensor:
        """The blocks and the final norm with the residual adds fused into the LayerNorms."""
        pending = None                                            # the stream is H + pending
        for blk in self.blks:
            if self.run_block is None:
                H, pending = blk.forward_addnorm(H, pending)      # (B, T, D) each
            else:
                H, pending = self.run_block(blk.forward_addnorm, H, pending)
        _, y = fused_norm(self.norm, H, pending)                  # (B, T, D)
        return self._linear(y, self.token_emb.weight)                 # (B, T, D) @ (D, V) -> (B, T, V)

    @property
    def checkpoint(self) -> bool:
        return self.run_block is not None

    def num_params(self) -> int:
        """Distinct parameters (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token, 6N + 12·L·T·D (see ``perfladder.config.flops_per_token``)."""
        c = self.config
        return _flops_per_token(self.num_params(), c.num_blks, seq_len, c.num_hiddens)
