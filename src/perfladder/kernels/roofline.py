"""A roofline per kernel group: how far each part of a measured step is from what it must cost.

No framework imports. Inputs:

* a ``KernelBreakdown`` (``perfladder.kernels``; or its ``to_dict()``, e.g. a rung's
  ``extra['kernels']``): summed device time per category over ``steps`` profiled steps, and
  the top kernels by name;
* a ``Workload``: the model's shapes (batch, context, width, heads, blocks, vocabulary), the
  compute precision and the dtype of the residual stream;
* ``Roofs``: the device's *measured* ceilings (``benchmarks/device_probe.py`` output): the
  device-to-device copy bandwidth and the large bf16 (or TF32) matmul rate.

For every group, ``roofline()`` works out from the shapes the bytes the group must move and
the FLOPs it must do per training step (forward + backward + optimizer update), and its
floor, ``max(bytes / copy bandwidth, FLOPs / matmul rate)``: the time it would take if its
kernels ran at the measured roof and moved each tensor once. The measured time above that
floor is what fusion or better kernels could win back.

Notation (per step): N = B*T tokens, D width, F = ffn_mult*D, L blocks, H heads, V vocab,
P parameters; ``a`` = bytes of an activation element in the compute dtype (2 in bf16),
``r`` = bytes of a residual-stream element (the recipe's own: 4 under PyTorch autocast with
its default fp32 stream, 2 with ``residual='bf16'`` and in the bf16 JAX model; see
``perfladder.kernels.accounting.workload_of``), weights and gradients of weights fp32 (4 B).
Each group's formula is in ``GROUPS`` (and printed by ``Roofline.markdown``):

* matmul -- the four GEMMs per block and the tied output projection, forward, input-gradient
  and weight-gradient products: FLOPs ``6 N (L (4D^2 + 2DF) + DV)`` (+``4NVD`` for a one-hot
  embedding); bytes: every product reads its two operands and writes its result once.
* attention -- causal, executed FLOPs (masked half skipped): forward QK^T and PV ``2NTD``,
  backward five products ``5NTD``; bytes: forward reads q, k, v, writes o; backward reads
  q, k, v, o, dO and writes dq, dk, dv: ``12 N D a`` per block (+ the fp32 row statistics).
* elementwise: RoPE -- rotate q and k: forward reads and writes both (``4 N D a``), backward
  the same for their gradients: ``8 N D a`` per block; nothing when the step's attention
  kernel rotates q and k itself (``Workload.rope_in_attention``: the fused attention of
  either framework reads q and k once, which the attention group's bytes already count).
* elementwise: GELU -- forward reads the pre-activation and writes the activation
  (``2 N F a``), backward reads the pre-activation and the incoming gradient and writes the
  outgoing one (``3 N F a``): ``5 N F a`` per block; nothing when the FFN's GEMMs apply it
  (``Workload.gelu_in_matmul``: PyTorch's fused 'mlp'); the backward's ``3 N F a`` alone when
  only the forward is in FC1's epilogue (``Workload.gelu_fwd_in_matmul``: JAX's
  'gelu_bias_grad', whose forward XLA fuses into cuBLASLt's GELU epilogue).
* elementwise: rest -- the embedding lookup and its gradient: ``2 N D r`` (write the rows,
  read their gradient); casts between dtypes must move nothing.
* layernorm/reductions -- 2L LayerNorms fused with the residual add before them, and the
  first one without: forward reads the stream and the branch, writes the new stream and the
  normalised activation (``2r + 2a``), backward reads the stream, the activation gradient
  and the stream gradient, writes the stream gradient and the branch gradient (``3r + 2a``),
  so ``(2L (5r + 4a) + (4r + 2a)) N D``; plus the loss over fp32 logits (``3 N V 4``). The
  residual adds are in this group because both compilers fuse them into the norm kernels.
* optimizer -- AdamW in fp32: read weights, gradients and both moments, write weights and
  moments: ``7 P 4``.
* copies -- copies, fills and casts: nothing must be copied, so the floor is 0.
* other -- collectives and unrecognised kernels: floor 0.

When the top kernels' names say which elementwise kernels rotate q/k (inductor names them
after ``cat``/``neg``/``slice``) or apply GELU, the elementwise group is split into RoPE,
GELU and the rest (only the listed top kernels can be attributed; the rest takes the
remainder of the category's time, and the bytes of any part not attributed). XLA's fusion
names do not tell, so a JAX breakdown keeps one elementwise row.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from perfladder.checks import check_int, check_positive
from perfladder.hardware import check_precision
from perfladder.kernels import CATEGORIES, KernelBreakdown
from perfladder.kernels.taxonomy import ROOFLINE_GROUPS

EMBEDS = ("gather", "onehot")

# kernel names that identify an elementwise kernel's job (inductor names fused kernels after
# the ops they hold: the RoPE backward is ``triton_poi_fused__to_copy_add_cat_mul_neg_slice_...``)
ROPE_NAMES = re.compile(r"rope|rotary|rotate|cat.*neg|neg.*cat", re.IGNORECASE)
GELU_NAMES = re.compile(r"gelu", re.IGNORECASE)

GROUPS = {
    # name: (breakdown categories, formula)
    "matmul": (("matmul",), "FLOPs 6N(L(4D^2+2DF)+DV) [+4NVD one-hot]; bytes: operands + result of each "
                            "forward, input-grad and weight-grad product"),
    "attention": (("attention",), "FLOPs 7NTD per block (causal: fwd 2, bwd 5); bytes 12NDa per block "
                                  "(+ row stats)"),
    "elementwise": (("elementwise",), "RoPE 8NDa (0 inside a fused attention) + GELU 5NFa (0 inside "
                                      "the FFN's GEMMs) per block, embedding 2NDr"),
    "elementwise: RoPE": ((), "8NDa per block (q, k and their gradients, read + written once); 0 when "
                              "the attention kernel rotates q and k"),
    "elementwise: GELU": ((), "5NFa per block (fwd: read h, write g; bwd: read h, dg, write dh); 0 when "
                              "the FFN's GEMMs apply it"),
    "elementwise: rest": ((), "embedding 2NDr (+ the bytes of any part not attributed by name)"),
    "layernorm/reductions": (("reduction/norm",), "(2L(5r+4a) + 4r+2a) ND: add+LayerNorm fwd+bwd; "
                                                   "loss 3NV*4"),
    "optimizer": (("optimizer",), "AdamW fp32: 7P*4"),
    "copies": (("memcpy/memset",), "0 (nothing must be copied)"),
    "other": (("collective", "other"), "0"),
}
assert tuple(GROUPS) == ROOFLINE_GROUPS, "kernels.taxonomy.ROOFLINE_GROUPS names these groups"
_covered = {c for cats, _ in GROUPS.values() for c in cats}
assert _covered == set(CATEGORIES), _covered
assert tuple(GROUPS) == ROOFLINE_GROUPS, tuple(GROUPS)


@dataclass(frozen=True)
class Workload:
    """What one training step computes: the model's shapes and dtypes."""
    batch: int
    seq: int
    width: int
    heads: int
    blocks: int
    vocab: int
    ffn_mult: int = 4
    precision: str = "bf16"          # compute dtype of activations and matmuls
    stream_fp32: bool = True         # residual stream in fp32 (PyTorch autocast) or the compute dtype
    embed: str = "gather"
    rope_in_attention: bool = False  # the attention kernel rotates q and k (no RoPE pass of its own)
    gelu_in_matmul: bool = False     # the FFN's GEMMs apply GELU and its derivative (no GELU pass)
    gelu_fwd_in_matmul: bool = False  # FC1's epilogue applies GELU; its backward is a pass of its own

    def __post_init__(self):
        for name in ("batch", "seq", "width", "heads", "blocks", "vocab", "ffn_mult"):
            check_int(name, getattr(self, name))
        if self.width % self.heads:
            raise ValueError(f"width={self.width} is not divisible by heads={self.heads}")
        check_precision(self.precision)
        if self.embed not in EMBEDS:
            raise ValueError(f"embed={self.embed!r} is not valid; valid choices: {EMBEDS}")

    @property
    def act_bytes(self) -> int:
        return 2 if self.precision == "bf16" else 4

    @property
    def stream_bytes(self) -> int:
        return 4 if self.stream_fp32 else self.act_bytes

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def params(self) -> int:
        D, F, L, V = self.width, self.ffn_mult * self.width, self.blocks, self.vocab
        return L * (4 * D * D + 4 * D + 2 * D * F + F + D + 4 * D) + V * D + 2 * D


@dataclass(frozen=True)
class Roofs:
    """Measured ceilings: copy bandwidth (bytes read + written per second) and matmul FLOP/s."""
    copy_bytes_per_s: float
    matmul_flops_per_s: float
    source: str = ""

    def __post_init__(self):
        for name in ("copy_bytes_per_s", "matmul_flops_per_s"):
            check_positive(name, getattr(self, name))

    @classmethod
    def from_probe(cls, probe: dict, precision: str = "bf16", source: str = "") -> "Roofs":
        """From ``benchmarks/device_probe.py``'s JSON: ``copy_tb_per_s`` and
        ``bf16_matmul_tflops`` (``tf32_matmul_tflops`` for ``precision='fp32'``)."""
        check_precision(precision)
        key = "bf16_matmul_tflops" if precision == "bf16" else "tf32_matmul_tflops"
        missing = [k for k in ("copy_tb_per_s", key) if k not in probe]
        if missing:
            raise ValueError(f"not a device_probe output: missing {missing}")
        return cls(copy_bytes_per_s=float(probe["copy_tb_per_s"]) * 1e12,
                   matmul_flops_per_s=float(probe[key]) * 1e12,
                   source=source or probe.get("device", ""))


# -- what each group must do ------------------------------------------------------------------
def _gemm(M: int, K: int, Nc: int, a: int, with_dgrad: bool = True) -> tuple[float, float]:
    """(FLOPs, bytes) of one linear layer X (M, K) @ W (K, Nc), forward + backward: the forward
    product, the input gradient (skipped when the input needs none) and the weight gradient
    (written in fp32)."""
    flops = 2 * M * K * Nc * (3 if with_dgrad else 2)
    fwd = (M * K + K * Nc + M * Nc) * a
    dgrad = (M * Nc + K * Nc + M * K) * a if with_dgrad else 0
    wgrad = (M * K + M * Nc) * a + K * Nc * 4
    return flops, fwd + dgrad + wgrad


def must_do(w: Workload) -> dict[str, tuple[float, float]]:
    """``{group: (bytes, FLOPs)}`` per step for every group of ``GROUPS`` (formulas there)."""
    N, T, D, L, V = w.tokens, w.seq, w.width, w.blocks, w.vocab
    F, H, a, r = w.ffn_mult * w.width, w.heads, w.act_bytes, w.stream_bytes
    mm_flops = mm_bytes = 0.0
    for K, Nc in ((D, 3 * D), (D, D), (D, F), (F, D)):
        f, b = _gemm(N, K, Nc, a)
        mm_flops += L * f
        mm_bytes += L * b
    f, b = _gemm(N, D, V, a)                            # tied output projection
    mm_flops, mm_bytes = mm_flops + f, mm_bytes + b
    embed_bytes = 2 * N * D * r                         # write the rows, read their gradient
    if w.embed == "onehot":                             # one_hot (N, V) @ table (V, D), fp32
        f, b = _gemm(N, V, D, 4, with_dgrad=False)
        mm_flops, mm_bytes = mm_flops + f, mm_bytes + b
    attn_bytes = L * (12 * N * D * a + 3 * N * H * 4)   # + logsumexp and delta rows, fp32
    attn_flops = L * 7 * N * T * D
    rope = ((0.0, 0.0) if w.rope_in_attention       # read with q and k by the attention kernel
            else (L * 8 * N * D * a, L * 12.0 * N * D))  # ~6 FLOPs per pair each way
    gelu = ((0.0, 0.0) if w.gelu_in_matmul            # in the GEMMs' prologue and epilogue
            else (L * 3 * N * F * a, L * 15.0 * N * F) if w.gelu_fwd_in_matmul   # the backward pass
            else (L * 5 * N * F * a, L * 25.0 * N * F))  # ~10 fwd + ~15 bwd per element
    rest = (embed_bytes, 0.0)
    norm_bytes = (2 * L * (5 * r + 4 * a) + (4 * r + 2 * a)) * N * D + 3 * N * V * 4
    norm_flops = (2 * L + 1) * 15.0 * N * D + 10.0 * N * V
    P = w.params
    return {
        "matmul": (mm_bytes, mm_flops),
        "attention": (attn_bytes, attn_flops),
        "elementwise": (rope[0] + gelu[0] + rest[0], rope[1] + gelu[1]),
        "elementwise: RoPE": rope,
        "elementwise: GELU": gelu,
        "elementwise: rest": rest,
        "layernorm/reductions": (norm_bytes, norm_flops),
        "optimizer": (7 * P * 4, 15.0 * P),
        "copies": (0.0, 0.0),
        "other": (0.0, 0.0),
    }


# -- the table ---------------------------------------------------------------------------------
@dataclass
class RooflineRow:
    group: str
    time_ms: float           # measured device time per step
    bytes: float             # must move per step
    flops: float             # must do per step
    floor_ms: float          # max(bytes / copy bandwidth, FLOPs / matmul rate)
    bound: str               # 'memory' | 'compute' | '-' (nothing must be done)
    gbps: float | None       # achieved: bytes / time
    bw_frac: float | None    # of the measured copy bandwidth
    tflops: float | None     # achieved: FLOPs / time
    mm_frac: float | None    # of the measured matmul rate
    formula: str
    kernels: list[str] = field(default_factory=list)   # top kernels attributed by name

    @property
    def above_ms(self) -> float:
        return self.time_ms - self.floor_ms

    def to_dict(self) -> dict:
        return {"group": self.group, "time_ms": self.time_ms, "bytes": self.bytes,
                "flops": self.flops, "floor_ms": self.floor_ms, "above_ms": self.above_ms,
                "bound": self.bound, "gbps": self.gbps, "bw_frac": self.bw_frac,
                "tflops": self.tflops, "mm_frac": self.mm_frac, "formula": self.formula,
                "kernels": list(self.kernels)}


@dataclass
class Roofline:
    workload: Workload
    roofs: Roofs
    rows: list[RooflineRow]          # top-level groups; sub-rows named 'elementwise: ...'
    title: str = ""

    def row(self, group: str) -> RooflineRow:
        for r in self.rows:
            if r.group == group:
                return r
        raise KeyError(f"no row {group!r}; rows: {[r.group for r in self.rows]}")

    @property
    def top_rows(self) -> list[RooflineRow]:
        return [r for r in self.rows if ": " not in r.group]

    @property
    def time_ms(self) -> float:
        return sum(r.time_ms for r in self.top_rows)

    @property
    def floor_ms(self) -> float:
        return sum(r.floor_ms for r in self.top_rows)

    def tokens_per_s_at(self, ms: float) -> float:
        return self.workload.tokens / (ms / 1e3)

    def to_dict(self) -> dict:
        return {"title": self.title, "workload": dataclasses.asdict(self.workload),
                "roofs": {"copy_bytes_per_s": self.roofs.copy_bytes_per_s,
                          "matmul_flops_per_s": self.roofs.matmul_flops_per_s,
                          "source": self.roofs.source},
                "rows": [r.to_dict() for r in self.rows],
                "time_ms": self.time_ms, "floor_ms": self.floor_ms}

    def markdown(self) -> str:
        w, rf = self.workload, self.roofs
        f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        lines = []
        if self.title:
            lines += [f"**{self.title}**", ""]
        lines += [f"B={w.batch}, T={w.seq}, D={w.width}, H={w.heads}, L={w.blocks}, V={w.vocab}, "
                  f"{w.precision} (a={w.act_bytes} B), residual stream {w.stream_bytes} B, "
                  f"{w.embed} embedding; roofs: copy {rf.copy_bytes_per_s / 1e12:.2f} TB/s, "
                  f"matmul {rf.matmul_flops_per_s / 1e12:.0f} TFLOP/s"
                  + (f" ({rf.source})" if rf.source else ""), "",
                  "| group | ms/step | must move GB | GFLOP | GB/s | % copy bw | TFLOP/s | % matmul roof "
                  "| floor ms | ms above floor |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in self.rows:
            name = r.group if ": " not in r.group else "&nbsp;&nbsp;" + r.group
            lines.append(f"| {name} | {r.time_ms:.2f} | {r.bytes / 1e9:.2f} | {r.flops / 1e9:.0f} | "
                         f"{f(r.gbps, '.0f')} | {f(None if r.bw_frac is None else 100 * r.bw_frac, '.0f')} | "
                         f"{f(r.tflops, '.0f')} | {f(None if r.mm_frac is None else 100 * r.mm_frac, '.0f')} | "
                         f"{r.floor_ms:.2f} | {r.above_ms:.2f} |")
        lines.append(f"| **total** | **{self.time_ms:.2f}** | | | | | | | **{self.floor_ms:.2f}** | "
                     f"**{self.time_ms - self.floor_ms:.2f}** |")
        lines += ["", f"Summed kernel time {self.time_ms:.2f} ms/step = "
                      f"{self.tokens_per_s_at(self.time_ms) / 1e6:.2f}M tokens/s if the device were never "
                      f"idle; every group at its floor: {self.floor_ms:.2f} ms/step = "
                      f"{self.tokens_per_s_at(self.floor_ms) / 1e6:.2f}M tokens/s.", "",
                  "Formulas (N=B*T, F=ffn_mult*D, a/r bytes per activation/stream element, P params):", ""]
        lines += [f"- {g}: {GROUPS[g][1]}" for g in GROUPS if any(r.group == g for r in self.rows)]
        attributed = [(r.group, k) for r in self.rows for k in r.kernels]
        if attributed:
            lines += ["", "Kernels attributed by name:", ""]
            lines += [f"- {g}: `{k[:100]}`" for g, k in attributed]
        return "\n".join(lines)


def _row(group: str, time_ms: float, bytes_: float, flops: float, roofs: Roofs,
         kernels=()) -> RooflineRow:
    t_mem = bytes_ / roofs.copy_bytes_per_s * 1e3
    t_mm = flops / roofs.matmul_flops_per_s * 1e3
    # elementwise FLOPs run on the CUDA cores, not against the matmul roof: only the matmul and
    # attention groups can be compute-bound here
    compute = group in ("matmul", "attention")
    floor = max(t_mem, t_mm) if compute else t_mem
    bound = "-" if floor == 0 else ("compute" if compute and t_mm >= t_mem else "memory")
    s = time_ms / 1e3
    return RooflineRow(group=group, time_ms=time_ms, bytes=bytes_, flops=flops, floor_ms=floor,
                       bound=bound,
                       gbps=bytes_ / s / 1e9 if s > 0 and bytes_ else None,
                       bw_frac=bytes_ / s / roofs.copy_bytes_per_s if s > 0 and bytes_ else None,
                       tflops=flops / s / 1e12 if s > 0 and compute else None,
                       mm_frac=flops / s / roofs.matmul_flops_per_s if s > 0 and compute else None,
                       formula=GROUPS[group][1], kernels=list(kernels))


def roofline(kb, workload: Workload, roofs: Roofs, title: str = "") -> Roofline:
    """The roofline table of breakdown ``kb`` (a ``KernelBreakdown`` or its dict) for
    ``workload`` on a device with ``roofs``. Times are per step (``category_us / steps``)."""
    if isinstance(kb, dict):
        kb = KernelBreakdown.from_dict(kb)
    if not isinstance(kb, KernelBreakdown):
        raise TypeError(f"kb must be a KernelBreakdown or its dict, got {type(kb).__name__}")
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a perfladder.kernels.roofline.Workload, got {type(workload).__name__}")
    if not isinstance(roofs, Roofs):
        raise TypeError(f"roofs must be a perfladder.kernels.roofline.Roofs, got {type(roofs).__name__}")
    ms = lambda us: us / kb.steps / 1e3  # noqa: E731
    need = must_do(workload)
    rows = []
    for group, (cats, _) in GROUPS.items():
        if not cats:
            continue
        t = ms(sum(kb.category_us.get(c, 0.0) for c in cats))
        rows.append(_row(group, t, *need[group], roofs))
        if group == "elementwise":
            rows += _split_elementwise(kb, t, need, roofs)
    return Roofline(workload=workload, roofs=roofs, rows=rows, title=title)


def _split_elementwise(kb: KernelBreakdown, total_ms: float, need: dict, roofs: Roofs) -> list:
    """Sub-rows RoPE / GELU / rest when top kernels' names identify them; [] otherwise."""
    found: dict[str, list] = {"elementwise: RoPE": [], "elementwise: GELU": []}
    for k in kb.top:
        if k.category != "elementwise":
            continue
        if ROPE_NAMES.search(k.name):
            found["elementwise: RoPE"].append(k)
        elif GELU_NAMES.search(k.name):
            found["elementwise: GELU"].append(k)
    if not any(found.values()):
        return []
    rows, rest_bytes, rest_flops, used = [], *need["elementwise: rest"], 0.0
    for group, ks in found.items():
        if ks:
            t = sum(k.total_us for k in ks) / kb.steps / 1e3
            used += t
            rows.append(_row(group, t, *need[group], roofs, kernels=[k.name for k in ks]))
        else:                        # not attributed: its bytes stay with the rest
            rest_bytes += need[group][0]
            rest_flops += need[group][1]
    rows.append(_row("elementwise: rest", max(total_ms - used, 0.0), rest_bytes, rest_flops, roofs))
    return rows
