"""The GPT in Flax NNX, in build order: RoPE, attention, feed-forward, block, model.

Parameter names follow CONTRIBUTING.md (``token_emb``, ``blks[i].attn.W_qkv``, ...), so
``perfladder.parity`` can copy weights between this model and the PyTorch one.

Precision is explicit and layered. ``param_dtype`` is what the parameters are stored in
(fp32 masters, always, in this ladder); ``dtype`` is the compute dtype every submodule
*remembers from construction* and casts to on each call. Both are passed to every
submodule, never left to flax's defaults: a module that remembers ``dtype=float32`` casts
a bf16 array it is handed straight back to fp32 -- which is exactly why casting the arrays
of an fp32 model does not make it compute in bf16 (rung R2a).

Shapes: B batch, T sequence, D width, H heads, Dh = D / H head width, V vocabulary.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from perfladder.config import GPTConfig, gpt_config
from perfladder.config import flops_per_token as _flops_per_token
from perfladder.jax.fused import check_fused

ATTN_IMPLS = (None, "xla", "cudnn")
EMBEDS = ("gather", "onehot")   # how the token embedding is looked up (see GPT.embed)
RESIDUALS = (None, "fp32", "bf16")   # the residual stream's dtype (see GPT); None: the compute dtype
_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))

_init = nnx.initializers.normal(stddev=0.02)   # kernels and embeddings
_zeros = nnx.initializers.zeros                 # biases


def _linear(d_in: int, d_out: int, *, dtype, param_dtype, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(d_in, d_out, use_bias=True, dtype=dtype, param_dtype=param_dtype,
                      kernel_init=_init, bias_init=_zeros, rngs=rngs)


def _layer_norm(d: int, eps: float, *, dtype, param_dtype, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(d, epsilon=eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


def check_token_ids(X, vocab_size: int, concrete_params: bool) -> None:
    """Token ids of shape (batch, seq_len), integers, every id in [0, vocab_size): one
    ValueError naming what is wrong and what is valid otherwise (an out-of-range id would
    otherwise come back as NaN logits: the lookup fills what it cannot gather).

    Shape and dtype are known at trace time and checked always. The range needs values, and
    under ``jit`` (or ``grad``) there are none in Python; ``checkify`` would change every
    jitted step's signature and a ``jax.debug.callback`` would put a host round trip in the
    timed step. So the values are checked where they are concrete: a direct call with
    concrete ids and concrete parameters (the user's eager call, the gates, the evaluation).
    Inside the ladder's transformed steps the ids come from ``perfladder.jax.batches``, whose
    tokens are indices of the corpus vocabulary the lab sizes the model with.
    """
    shape, dtype = getattr(X, "shape", None), getattr(X, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(f"token ids must be an array of shape (batch, seq_len), got {type(X).__name__}")
    if len(shape) != 2:
        raise ValueError(f"token ids must have shape (batch, seq_len); got shape {tuple(shape)}")
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"token ids must be integers (e.g. int32); got dtype {dtype}")
    if 0 in tuple(shape):
        raise ValueError(f"token ids of shape {tuple(shape)} hold no tokens; give at least one")
    if concrete_params and not isinstance(X, jax.core.Tracer):
        ids = np.asarray(X)
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"token id {lo if lo < 0 else hi} is out of range: valid ids are "
                             f"0 to {vocab_size - 1} (vocab_size={vocab_size})")


# -- 1. rotary position embedding ------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def rope_tables(T: int, Dh: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the rotation angles, each (T, Dh) fp32, computed in numpy.

    They depend on shapes only, so they are worked out once, on the host, while the step is
    traced, and enter the XLA program as constants. Computed with ``jnp`` inside the traced
    function instead, XLA fuses ``cos``/``sin`` into the elementwise kernel that rotates q
    and k and evaluates them for every element of (B, T, H, Dh): B*H times the work.
    """
    half = Dh // 2
    inv_freq = np.float32(base) ** (-np.arange(half, dtype=np.float32) / np.float32(half))  # (Dh/2,)
    angles = np.arange(T, dtype=np.float32)[:, None] * inv_freq[None]                        # (T, Dh/2)
    angles = np.concatenate([angles, angles], axis=-1)                                       # (T, Dh)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    cos.flags.writeable = sin.flags.writeable = False          # shared by every caller
    return cos, sin


def rope(x: jax.Array, base: float = 10000.0) -> jax.Array:
    """Rotary embedding, rotate-half form, on ``x`` of shape (B, T, H, Dh).

    The rotation is computed in fp32 whatever ``x`` is, from the constant tables of
    ``rope_tables``; the result is cast back to ``x.dtype``. Without that cast, a bf16
    model's queries and keys would leave this function as fp32 and reach attention in a
    different dtype from the values.
    """
    T, Dh = x.shape[1], x.shape[-1]
    half = Dh // 2
    cos, sin = rope_tables(T, Dh, float(base))                            # (T, Dh) each
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]               # (1, T, 1, Dh)
    x32 = x.astype(jnp.float32)
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)  # (B, T, H, Dh)
    return (x32 * cos + rotated * sin).astype(x.dtype)


# -- 2. causal self-attention ----------------------------------------------------------------
class CausalAttention(nnx.Module):
    """Fused QKV projection, RoPE on q and k, causal scaled-dot-product attention.

    ``fused_attention``: the split, RoPE, attention and the merge of the heads in one Pallas
    kernel each way (``fused.attention``), from the (B, T, 3D) projection to ``W_o``'s input,
    which with ``bias_on_load`` adds the projection's bias where it loads q, k and v."""

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs, dtype, param_dtype, attn_impl=None,
                 fused_attention: bool = False, bias_on_load: bool = False):
        D = cfg.num_hiddens
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.use_rope, self.rope_base = cfg.pos == "rope", cfg.rope_base
        self.attn_impl = attn_impl
        if fused_attention and not self.use_rope:
            raise ValueError(f"fused 'attention' needs pos='rope'; this config has pos={cfg.pos!r}")
        if fused_attention and attn_impl is not None:
            raise ValueError(f"fused 'attention' replaces jax.nn.dot_product_attention, so "
                             f"attn_impl must be None; got attn_impl={attn_impl!r}")
        if bias_on_load and not fused_attention:
            raise ValueError("fused 'attention_bias' adds the QKV bias inside fused 'attention': it needs it")
        self.fused_attention, self.bias_on_load = bool(fused_attention), bool(bias_on_load)
        self.W_qkv = _linear(D, 3 * D, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.W_o = _linear(D, D, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        B, T, D = x.shape
        if self.fused_attention:
            from perfladder.jax.fused import matmul_and_bias
            from perfladder.jax.fused.attention import rope_attention
            cos, sin = rope_tables(T, self.head_dim, float(self.rope_base))   # (T, Dh) each
            u, bias = matmul_and_bias(self.W_qkv, x) if self.bias_on_load else (self.W_qkv(x), None)
            return self.W_o(rope_attention(u, cos, sin, self.num_heads, bias=bias))  # (B, T, D)
        qkv = self.W_qkv(x)                                           # (B, T, 3D)
        heads = (B, T, self.num_heads, self.head_dim)
        q, k, v = (part.reshape(heads)                                # 3 x (B, T, H, Dh)
                   for part in jnp.split(qkv, 3, axis=-1))            # 3 x (B, T, D)
        if self.use_rope:
            q, k = rope(q, self.rope_base), rope(k, self.rope_base)   # (B, T, H, Dh), dtype kept
        attended = jax.nn.dot_product_attention(                      # scale 1/sqrt(Dh)
            q, k, v, implementation=self.attn_impl, is_causal=True)   # (B, T, H, Dh)
        merged = attended.reshape(B, T, D)                            # heads back side by side
        return self.W_o(merged)                                       # (B, T, D)


# -- 3. feed-forward -------------------------------------------------------------------------
class FFN(nnx.Module):
    """dense2(gelu_tanh(dense1(x))), width ffn_mult * D; ``fused_gelu``: ``fused.gelu_bias_grad``."""

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs, dtype, param_dtype, fused_gelu: bool = False):
        D, F = cfg.num_hiddens, cfg.ffn_mult * cfg.num_hiddens
        self.fused_gelu = bool(fused_gelu)
        self.dense1 = _linear(D, F, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.dense2 = _linear(F, D, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.fused_gelu:
            from perfladder.jax.fused.gelu_bias_grad import ffn
            return ffn(self, x)                                            # (B, T, D)
        return self.dense2(jax.nn.gelu(self.dense1(x), approximate=True))  # (B, T, D)


# -- 4. pre-norm transformer block -----------------------------------------------------------
class Block(nnx.Module):
    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs, dtype, param_dtype, attn_impl=None,
                 fused: tuple = ()):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm1 = _layer_norm(cfg.num_hiddens, cfg.ln_eps, **kw)
        self.attn = CausalAttention(cfg, attn_impl=attn_impl, fused_attention="attention" in fused,
                                    bias_on_load="attention_bias" in fused, **kw)
        self.norm2 = _layer_norm(cfg.num_hiddens, cfg.ln_eps, **kw)
        self.ffn = FFN(cfg, fused_gelu="gelu_bias_grad" in fused, **kw)

    def __call__(self, H: jax.Array) -> jax.Array:
        H = H + self.attn(self.norm1(H))    # (B, T, D)
        return H + self.ffn(self.norm2(H))  # (B, T, D)

    def forward_addnorm(self, H: jax.Array, pending: jax.Array | None):
        """The same block with each residual add fused into the LayerNorm after it (Pallas).

        The block's input is ``H + pending`` (``pending=None``: ``H``); it returns ``(H, ffn
        output)`` in the same form, so the FFN's residual add happens in the next block's first
        (or the final) fused LayerNorm.
        """
        H, y = fused_norm(self.norm1, H, pending)              # (B, T, D) each
        H, y = fused_norm(self.norm2, H, self.attn(y))
        return H, self.ffn(y)


def fused_norm(norm: nnx.LayerNorm, H: jax.Array, pending: jax.Array | None):
    """``(H + pending, norm(H + pending))`` through the Pallas kernels (``pending=None``: no add).
    Scale and bias are cast to the norm's compute dtype first, as flax's LayerNorm does."""
    from perfladder.jax.fused.add_layer_norm import add_layer_norm, layer_norm
    scale = norm.scale[...].astype(norm.dtype)                 # (D,)
    bias = norm.bias[...].astype(norm.dtype)
    if pending is None:
        return H, layer_norm(H, scale, bias, norm.epsilon)
    return add_layer_norm(H, pending, scale, bias, norm.epsilon)


def _run_block(blk: Block, H: jax.Array) -> jax.Array:
    return blk(H)


def _run_block_addnorm(blk: Block, H: jax.Array, pending):
    return blk.forward_addnorm(H, pending)


# -- 5. activation checkpointing (rung R4's technique) ----------------------------------------
def checkpoint_block(run_block):
    """R4: a block run that keeps only its inputs; the backward pass
    recomputes the rest."""
    return nnx.remat(run_block)


@functools.lru_cache(maxsize=None)
def _wrapped(wrap, run_block):
    """``wrap(run_block)``, made once per wrapper: a block function is static model structure,
    and a fresh function object per model would make every fresh model compile anew."""
    return run_block if wrap is None else wrap(run_block)


# What the forward computes in, written while it runs (under jit: once, while traced): a ``TrainStep``
# opens ``observing(its dict)`` around its calls, so its receipt comes from the program timed.
_OBSERVE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("observe", default=None)


@contextlib.contextmanager
def observing(into: dict | None):
    token = _OBSERVE.set(into)
    try:
        yield into
    finally:
        _OBSERVE.reset(token)


# -- 6. the model ----------------------------------------------------------------------------
class GPT(nnx.Module):
    """Decoder-only transformer with tied input/output embeddings.

    ``dtype``: compute dtype of every submodule. ``param_dtype``: storage dtype of the
    parameters (keep fp32: these are the masters the optimizer updates).
    ``attn_impl``: passed to ``jax.nn.dot_product_attention`` (None lets JAX choose;
    ``'cudnn'`` needs a GPU and a half-precision ``dtype``).
    ``checkpoint``: run every block through ``checkpoint_block`` (activation checkpointing), or
    through the wrapper given (a reader's own version of the technique).
    ``embed_fp32``: look the tokens up in the fp32 table and cast the rows to ``dtype``
    afterwards, so that in the backward pass the embedding gradient is accumulated into
    the V-row table in fp32 rather than in ``dtype``.
    ``embed``: how the lookup is done. ``'gather'`` (default) takes rows of the table; its
    gradient is a scatter-add of B*T rows into V rows, which on a GPU is a pile of atomic
    adds on the same few addresses when V is small. ``'onehot'`` multiplies a one-hot
    (B, T, V) matrix by the table: the same rows (exactly), 2*V*D extra FLOPs per token, and
    a gradient that is a matmul (one_hot^T @ dH), with no scatter at all.
    ``GPT(vocab_size, num_hiddens=512, num_blks=6, rngs=...)`` (any ``GPTConfig`` field as a
    keyword) builds the same model as ``GPT(GPTConfig(vocab_size=..., ...), rngs=...)``.
    ``fused``: Pallas kernels for memory-bound ops (``perfladder.jax.fused``): ``'addnorm'``
    fuses each residual add into the LayerNorm after it, forward and backward; ``'attention'``
    runs the QKV split, RoPE, causal attention and the head merge as one kernel each way (not
    with a pinned ``attn_impl``), with ``'attention_bias'`` adding the QKV bias on load;
    ``'gelu_bias_grad'`` runs GELU's backward and FC1's bias gradient as one kernel. The
    default ``()`` runs the reference ops; the parameters and the math are the same either way.
    ``residual``: the dtype of the residual stream H between blocks. ``None`` (default): the
    compute dtype -- under ``dtype=bfloat16`` the stream is already bf16 here (every add of two
    bf16 arrays is bf16; flax's LayerNorm computes its statistics in fp32 and returns
    ``dtype``), unlike PyTorch's autocast, which keeps it fp32. ``'fp32'``: the stream in fp32
    whatever ``dtype`` (the embedding rows and every residual add in fp32; the branches still
    compute in ``dtype``): PyTorch's layout, and the reference a bf16 stream is measured
    against. ``'bf16'``: a bf16 stream, which needs ``dtype=bfloat16`` (there it is what
    ``None`` gives). A bf16 stream is **a numerics change**: the adds and their gradients round
    to bf16.
    """

    def __init__(self, config: GPTConfig | int, *, rngs: nnx.Rngs, dtype=jnp.float32,
                 param_dtype=jnp.float32, attn_impl=None, checkpoint: bool = False,
                 embed_fp32: bool = False, embed: str = "gather", fused: tuple = (),
                 residual: str | None = None, **arch):
        config = gpt_config(config, **arch)   # GPT(cfg) or the chapter's GPT(vocab_size, num_hiddens=...)
        if attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl={attn_impl!r} is not valid; valid choices: {ATTN_IMPLS}")
        if embed not in EMBEDS:
            raise ValueError(f"embed={embed!r} is not valid; valid choices: {EMBEDS}")
        dtype, param_dtype = jnp.dtype(dtype), jnp.dtype(param_dtype)
        for name, dt in (("dtype", dtype), ("param_dtype", param_dtype)):
            if not jnp.issubdtype(dt, jnp.floating):
                raise ValueError(f"{name}={dt} must be a floating dtype (e.g. float32, bfloat16)")
        if residual not in RESIDUALS:
            raise ValueError(f"residual={residual!r} is not valid; valid choices: {RESIDUALS}")
        if residual == "bf16" and dtype != jnp.bfloat16:
            raise ValueError(f"residual='bf16' needs dtype=bfloat16 (bf16 compute); got dtype={dtype}")
        if attn_impl == "cudnn" and dtype not in _HALF:
            raise ValueError(f"attn_impl='cudnn' needs a half-precision compute dtype "
                             f"(bfloat16 or float16); got dtype={dtype}")
        self.config = config
        self.dtype, self.param_dtype = dtype, param_dtype
        self.use_checkpoint(checkpoint)
        self.attn_impl, self.embed_fp32 = attn_impl, bool(embed_fp32)
        self.embed_impl = embed   # not ``self.embed``: that is the method below
        self.fused = check_fused(fused)
        self.residual = residual
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        D = config.num_hiddens
        self.token_emb = nnx.Embed(config.vocab_size, D, embedding_init=_init, **kw)
        if config.pos == "learned":
            self.pos_emb = nnx.Embed(config.max_len, D, embedding_init=_init, **kw)
        self.blks = nnx.List([Block(config, attn_impl=attn_impl, fused=self.fused, **kw)
                              for _ in range(config.num_blks)])
        self.norm = _layer_norm(D, config.ln_eps, **kw)

    def use_checkpoint(self, checkpoint) -> None:
        """Run every block through ``checkpoint_block`` (True), the wrapper given, or plainly."""
        if not (isinstance(checkpoint, bool) or callable(checkpoint)):
            raise ValueError(f"checkpoint={checkpoint!r} must be True, False or a block wrapper "
                             "such as checkpoint_block")
        wrap = checkpoint_block if checkpoint is True else checkpoint or None
        self.checkpoint = wrap is not None
        self._run = _wrapped(wrap, _run_block)
        self._run_addnorm = _wrapped(wrap, _run_block_addnorm)

    def embed(self, X: jax.Array) -> jax.Array:
        """The first activation: token (+ learned position) embedding, (B, T) -> (B, T, D).

        Its dtype is the precision receipt: it is what every later layer computes in.
        """
        T = X.shape[1]
        if T > self.config.max_len and self.config.pos == "learned":
            raise ValueError(f"sequence length {T} exceeds max_len={self.config.max_len}")
        if self.embed_impl == "onehot":
            H = self._onehot_lookup(X)                                     # (B, T, D)
        elif self.embed_fp32:
            table = self.token_emb.embedding[...].astype(jnp.float32)     # (V, D) fp32
            H = jnp.take(table, X, axis=0).astype(self.dtype)              # (B, T, D)
        else:
            H = self.token_emb(X)                                          # (B, T, D)
        if self.config.pos == "learned":
            H = H + self.pos_emb(jnp.arange(T))[None]                      # (1, T, D) broadcast
        return H

    def _onehot_lookup(self, X: jax.Array) -> jax.Array:
        """Rows of the table as a matmul: one_hot(X) (B, T, V) @ table (V, D) -> (B, T, D).

        Done in fp32 with ``embed_fp32`` (at full fp32 precision, so no TF32 rounding of the
        table), in the compute dtype otherwise; either way each output is one table entry
        times 1 plus zeros, so the rows come out exactly as a gather gives them.
        """
        lookup = jnp.dtype(jnp.float32) if self.embed_fp32 else self.dtype
        table = self.token_emb.embedding[...].astype(lookup)                  # (V, D)
        onehot = jax.nn.one_hot(X, self.config.vocab_size, dtype=lookup)      # (B, T, V)
        precision = jax.lax.Precision.HIGHEST if lookup == jnp.float32 else None
        return jnp.matmul(onehot, table, precision=precision).astype(self.dtype)  # (B, T, D)

    def __call__(self, X: jax.Array, observe: dict | None = None) -> jax.Array:
        """Token ids (B, T) -> logits (B, T, V) in the compute dtype.

        ``observe`` (a dict) receives the dtypes of the first activation and of the logits,
        written while this forward runs -- under ``jit``, once, while it is traced -- so a
        jitted step reports what it computes in from the program itself.
        """
        check_token_ids(X, self.config.vocab_size,
                        not isinstance(self.token_emb.embedding[...], jax.core.Tracer))
        observe = _OBSERVE.get() if observe is None else observe
        H = self.embed(X)                                                  # (B, T, D)
        if observe is not None:
            observe["first_activation"] = str(jnp.result_type(H))
        if self.residual is not None:                                      # the stream's dtype
            H = H.astype(jnp.float32 if self.residual == "fp32" else jnp.bfloat16)
        if "addnorm" in self.fused:
            pending = None                                                 # the stream is H + pending
            for blk in self.blks:
                H, pending = self._run_addnorm(blk, H, pending)            # (B, T, D) each
            logits = self.token_emb.attend(fused_norm(self.norm, H, pending)[1])  # (B, T, V)
        else:
            for blk in self.blks:
                H = self._run(blk, H)                                      # (B, T, D)
            logits = self.token_emb.attend(self.norm(H))                     # (B, T, V) tied
        if observe is not None:
            observe["logits"] = str(jnp.result_type(logits))
        return logits

    def num_params(self) -> int:
        leaves = jax.tree.leaves(nnx.state(self, nnx.Param))
        return int(sum(leaf.size for leaf in leaves))

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token, ``6 N + 12 L T D`` (see ``perfladder.config``)."""
        return _flops_per_token(self.num_params(), self.config.num_blks, seq_len,
                                self.config.num_hiddens)
