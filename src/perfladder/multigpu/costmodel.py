"""The data-parallel cost model, written down before anything is launched (no framework imports).

Weak scaling: each of ``k`` ranks runs the single-GPU step on its own batch of
``per_rank_batch`` sequences, then the ranks sum their gradients. Two terms per step:

* ``t_compute`` = tokens per rank / the single-GPU rate *measured* at that per-rank batch
  and in that form (the step does not get faster or slower because others exist);
* ``t_comm``    = one all-reduce of the fp32 gradients, ``4 x num_params`` bytes. A ring
  all-reduce of S bytes over k ranks moves ``2 (k-1)/k x S`` bytes through every rank's
  link (reduce-scatter, then all-gather), so ``t_comm = 2 (k-1)/k x S / bus_bw``.
  ``bus_bw`` is the *bus bandwidth* in NCCL's convention (``busbw`` in nccl-tests), the
  one number a ring all-reduce of a large buffer sustains per rank.

``predicted_tokens_per_s = k x B x T / (t_compute + t_comm)`` assumes no overlap. It is no
floor: it prices the single-GPU step and the wire and nothing else a data-parallel step adds
(the gradient buckets' copies, waiting for the slowest rank, the collectives' launches), so
measurements land below it; it is read as an upper estimate. The model's own ceiling,
``ceiling_tokens_per_s = k x B x T / max(t_compute, t_comm)`` (the all-reduce wholly hidden
under the backward pass), bounds every measurement from above; while the wire is the smaller
term it is ``k`` times the single-GPU rate, the linear ceiling;
``efficiency = predicted / linear = t_compute / (t_compute + t_comm)``.

The link speeds are assumptions, named in ``LINKS`` with where each number comes from;
the ranks also time an all-reduce of a gradient-sized buffer themselves, and a measurement
records both. Latency (the per-hop start-up cost, which matters for small buffers and very
long rings) is left out: a 76 MB gradient is deep in the bandwidth-bound regime.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import re
from dataclasses import dataclass, field

from perfladder import words
from perfladder.checks import check_int, check_positive
from perfladder.hardware import nvidia_smi
from perfladder.measure.evidence import Prediction

GRAD_BYTES_PER_PARAM = 4          # fp32 gradients (masters stay fp32 in both forms)
PREDICT_KS = (2, 4, 8)            # printed before launch on every build, whatever the machine
SCOPES = ("intra-node", "inter-node", "cpu")


@dataclass(frozen=True)
class Link:
    """One interconnect, priced by the bus bandwidth a large ring all-reduce reaches on it."""
    name: str
    bus_bytes_per_s: float
    scope: str                     # 'intra-node' | 'inter-node' | 'cpu'
    what: str
    source: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


LINKS: dict[str, Link] = {link.name: link for link in (
    # H200 SXM: 18 fourth-generation NVLinks, 900 GB/s per GPU counting both directions,
    # 450 GB/s each way (NVIDIA's H200 datasheet; MLCommons system descriptions of 8x H200
    # SXM boxes quote "18x 4th Gen NVLink, 900GB/s"). A large copy between two NVLink-4 GPUs
    # reaches about 380 of the 450 GB/s (NVIDIA's p2pBandwidthLatencyTest on H100 SXM, in
    # NVIDIA/nccl issue 1264). NVLink SHARP (NVLS) all-reduce reports more, but NVLS stays
    # off here (NCCL_NVLS_ENABLE=0), so we price the plain ring at 80% of the link rate.
    Link("nvlink4-h200", 360e9, "intra-node", "H200 SXM, NVLink 4 through NVSwitch, NVLS off",
         "80% of the 450 GB/s each-way NVLink-4 rate (H200 datasheet: 18 links, 900 GB/s "
         "bidirectional); point-to-point copies reach ~380 GB/s"),
    # The chapter's box: four RTX 4090s without NVLink or peer-to-peer access, so data
    # moving from one GPU to another goes through host memory, over PCIe. The chapter prices its
    # all-reduce with 4.5 GB/s in a bytes-per-device convention where t = 2 S / beta,
    # which at k = 2 is the same time as a bus bandwidth of 2.25 GB/s in ours
    # (t = 2 (k-1)/k S / busbw); NCCL's own busbw on that box read ~2 GB/s.
    Link("pcie-host-staged", 2.25e9, "intra-node",
         "PCIe without peer-to-peer (4x RTX 4090): GPU -> host memory -> GPU",
         "the chapter's measured 4.5 GB/s per device in its t = 2S/beta convention "
         "(= 2.25 GB/s busbw at k = 2; NCCL busbw there read ~2 GB/s)"),
    # InfiniBand NDR: 400 Gb/s = 50 GB/s each way per port, one ConnectX-7 port per GPU in
    # HGX H100/H200 nodes (rail-optimised). We price the inter-node ring at 80% of line rate.
    Link("ib-ndr400", 40e9, "inter-node", "InfiniBand NDR 400 Gb/s, one port per GPU",
         "80% of the 50 GB/s each-way line rate of one NDR port"),
    # CPU ranks exchanging over loopback TCP (gloo): only ever used to exercise the code.
    Link("gloo-loopback", 1e9, "cpu", "CPU processes, gloo over loopback TCP",
         "a nominal figure; CPU runs test the code path, not an interconnect"),
)}
LINK_NAMES = tuple(LINKS)
# The box a single-GPU build prices its k = 2, 4, 8 predictions for: the book's reference, an
# NVLink H200 node (one GPU alone shows no link to read).
REFERENCE_LINK = "nvlink4-h200"
_NVLINK = re.compile(r"\bNV\d+\b")       # 'NV18' in `nvidia-smi topo -m`; the legend's 'NV#' is not


def is_nvlink(link) -> bool:
    """Is ``link`` (a ``Link`` or a ``LINKS`` name) an NVLink between GPUs?"""
    return get_link(link).name.startswith("nvlink")


def gpu_topology() -> str | None:
    """``nvidia-smi topo -m``: the GPU-to-GPU connection matrix (None without nvidia-smi or when it fails)."""
    return nvidia_smi("topo", "-m")


def machine_link(gpu_count: int, topology: str | None = None) -> str:
    """The ``LINKS`` entry this machine's all-reduce is priced with, unless a caller names one.

    No GPU: CPU ranks over gloo ('gloo-loopback'). One GPU: the book's reference node
    (``REFERENCE_LINK``), since there is no link here to read. Two or more: NVLink between them
    in ``topology`` (``gpu_topology()`` when None) prices them as the reference node; otherwise
    (PCIe, or a matrix that could not be read) as the chapter's PCIe box without peer-to-peer
    copies ('pcie-host-staged'), the pessimistic case. The name is printed with every
    prediction and recorded in its assumptions."""
    gpu_count = check_int("gpu_count", gpu_count, minimum=0)
    if gpu_count == 0:
        return "gloo-loopback"
    if gpu_count == 1:
        return REFERENCE_LINK
    topology = gpu_topology() if topology is None else topology
    return REFERENCE_LINK if _NVLINK.search(topology or "") else "pcie-host-staged"


def get_link(link) -> Link:
    """``link`` as a ``Link``: a ``Link`` passes through, a name is looked up in ``LINKS``."""
    if isinstance(link, Link):
        return link
    if link not in LINKS:
        raise ValueError(f"unknown link {link!r}; valid choices: {LINK_NAMES}")
    return LINKS[link]


@dataclass(frozen=True)
class Estimate:
    """What the cost model says about ``k``-way data parallelism, before anything runs: one
    point of the ``perfladder.measure.evidence.Prediction`` a rung writes down."""
    k: int
    per_rank_batch: int
    seq_len: int
    num_params: int
    grad_bytes: int
    single_tokens_per_s: float        # the measured single-GPU rate the compute term comes from
    t_compute_s: float
    t_comm_s: float
    predicted_tokens_per_s: float     # no overlap: an upper estimate (see the module docstring)
    linear_tokens_per_s: float        # k x single
    efficiency: float                 # predicted / linear
    link: str                         # the (intra-node) link
    bus_bytes_per_s: float
    nodes: int = 1
    gpus_per_node: int = 0            # 0: a single flat ring (one node or one link)
    inter_link: str | None = None
    inter_bus_bytes_per_s: float | None = None
    assumptions: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["assumptions"] = list(self.assumptions)
        return d

    def line(self) -> str:
        """One printable line: both terms, the prediction, the ceiling, the efficiency."""
        where = (f"{self.link} {words.gbps(self.bus_bytes_per_s)} GB/s" if self.inter_link is None else
                 f"{self.nodes} nodes x {self.gpus_per_node}: {self.link} "
                 f"{words.gbps(self.bus_bytes_per_s)} GB/s + {self.inter_link} "
                 f"{words.gbps(self.inter_bus_bytes_per_s)} GB/s")
        return (f"predict k={self.k}: batch {self.per_rank_batch}/rank, t_compute "
                f"{words.ms(self.t_compute_s)} + t_comm {words.ms(self.t_comm_s)} ({where}) "
                f"-> {words.rate(self.predicted_tokens_per_s)} tokens/s without overlap, linear "
                f"{words.rate(self.linear_tokens_per_s)}, efficiency {words.percent(self.efficiency, 1)}")


def ceiling_tokens_per_s(estimate) -> float:
    """The cost model's ceiling for an ``Estimate`` (or its dict): ``k x B x T / max(t_compute,
    t_comm)``, the all-reduce wholly hidden under the step (linear while the wire is the
    smaller term). No measurement of a step the model prices can exceed it."""
    e = estimate.to_dict() if isinstance(estimate, Estimate) else estimate
    tokens = e["k"] * e["per_rank_batch"] * e["seq_len"]
    return tokens / max(e["t_compute_s"], e["t_comm_s"])


# -- the two terms ---------------------------------------------------------------------------
def _size(name: str, v) -> float:
    """A byte count: a finite number >= 0 (a bool, a negative or a NaN size is an error)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{name}={v!r} must be a finite number of bytes >= 0")
    return float(v)


def ring_allreduce_seconds(nbytes: float, k: int, bus_bytes_per_s: float) -> float:
    """One ring all-reduce of ``nbytes`` over ``k`` ranks: ``2 (k-1)/k x nbytes / bus_bw``."""
    nbytes = _size("nbytes", nbytes)
    check_int("k", k)
    return 2 * (k - 1) / k * nbytes / check_positive("bus_bytes_per_s", bus_bytes_per_s)


def hierarchical_allreduce_seconds(nbytes: float, k: int, gpus_per_node: int, intra, inter) -> float:
    """All-reduce over ``k`` GPUs in nodes of ``gpus_per_node``: ring inside, ring across.

    Within one node (``k <= gpus_per_node``) this is one ring on the intra-node link.
    Across ``n = k / gpus_per_node`` nodes (NCCL's hierarchical pattern): a reduce-scatter
    inside each node leaves every GPU owning 1/g of the sum; the g GPUs of a node then each
    run an inter-node ring all-reduce of their 1/g shard, concurrently on their own NICs
    (one port per GPU); an all-gather inside the node completes it. Seconds:
    ``2 (g-1)/g x S / bw_intra + 2 (n-1)/n x (S/g) / bw_inter``.
    """
    nbytes = _size("nbytes", nbytes)
    g = check_int("gpus_per_node", gpus_per_node)
    k = check_int("k", k)
    intra, inter = get_link(intra), get_link(inter)
    if k <= g:
        return ring_allreduce_seconds(nbytes, k, intra.bus_bytes_per_s)
    if k % g:
        raise ValueError(f"k={k} GPUs do not fill whole nodes of gpus_per_node={g}; "
                         f"valid choices: k <= {g} or a multiple of {g}")
    n = k // g
    return (ring_allreduce_seconds(nbytes, g, intra.bus_bytes_per_s)
            + ring_allreduce_seconds(nbytes / g, n, inter.bus_bytes_per_s))


# -- predictions ---------------------------------------------------------------------------------
def _compute_terms(k, per_rank_batch, seq_len, single_tokens_per_s, num_params):
    check_int("k", k)
    check_int("per_rank_batch", per_rank_batch)
    check_int("seq_len", seq_len)
    check_int("num_params", num_params)
    rate = check_positive("single_tokens_per_s", single_tokens_per_s)
    tokens = per_rank_batch * seq_len
    return tokens / rate, tokens, rate


def _assemble(k, per_rank_batch, seq_len, num_params, rate, t_compute, t_comm, tokens,
              intra: Link, **topology) -> Estimate:
    linear = k * tokens / t_compute
    predicted = k * tokens / (t_compute + t_comm)
    inter = topology.pop("inter", None)
    assumptions = [f"fp32 gradients: {GRAD_BYTES_PER_PARAM} bytes x {num_params:,} parameters",
                   "ring all-reduce: each rank moves 2(k-1)/k of the gradient bytes",
                   f"{intra.name}: {words.gbps(intra.bus_bytes_per_s)} GB/s bus bandwidth -- {intra.source}",
                   "no overlap of communication with compute, and no other data-parallel cost "
                   "priced: an upper estimate, the all-reduce wholly hidden its ceiling",
                   f"t_compute from a measured single-device rate of {words.rate(rate)} tokens/s at "
                   f"batch {per_rank_batch}"]
    if inter is not None:
        assumptions.append(f"{inter.name}: {words.gbps(inter.bus_bytes_per_s)} GB/s per GPU -- "
                           f"{inter.source}; hierarchical all-reduce (ring inside a node, "
                           "ring across nodes on 1/g shards)")
    return Estimate(
        k=k, per_rank_batch=per_rank_batch, seq_len=seq_len, num_params=num_params,
        grad_bytes=GRAD_BYTES_PER_PARAM * num_params, single_tokens_per_s=rate,
        t_compute_s=t_compute, t_comm_s=t_comm, predicted_tokens_per_s=predicted,
        linear_tokens_per_s=linear, efficiency=predicted / linear, link=intra.name,
        bus_bytes_per_s=intra.bus_bytes_per_s,
        inter_link=None if inter is None else inter.name,
        inter_bus_bytes_per_s=None if inter is None else inter.bus_bytes_per_s,
        assumptions=tuple(assumptions), **topology)


def predict(k: int, per_rank_batch: int, seq_len: int, single_tokens_per_s: float,
            num_params: int, link=REFERENCE_LINK) -> Estimate:
    """The no-overlap prediction for ``k`` ranks on one flat ring over ``link``.

    ``link``: a name in ``LINKS`` (or a ``Link``); ``single_tokens_per_s``: the single
    device's measured rate at ``per_rank_batch`` in the same form (seed or fast).
    """
    t_compute, tokens, rate = _compute_terms(k, per_rank_batch, seq_len, single_tokens_per_s,
                                             num_params)
    k, per_rank_batch, seq_len, num_params = int(k), int(per_rank_batch), int(seq_len), int(num_params)
    link = get_link(link)
    t_comm = ring_allreduce_seconds(GRAD_BYTES_PER_PARAM * num_params, k, link.bus_bytes_per_s)
    return _assemble(k, per_rank_batch, seq_len, num_params, rate, t_compute, t_comm, tokens, link)


def predict_hierarchical(k: int, per_rank_batch: int, seq_len: int, single_tokens_per_s: float,
                         num_params: int, *, gpus_per_node: int = 8, intra=REFERENCE_LINK,
                         inter="ib-ndr400") -> Estimate:
    """``predict`` for ``k`` GPUs spread over nodes of ``gpus_per_node`` (see
    ``hierarchical_allreduce_seconds``); one node is exactly ``predict`` over ``intra``."""
    t_compute, tokens, rate = _compute_terms(k, per_rank_batch, seq_len, single_tokens_per_s,
                                             num_params)
    k, per_rank_batch, seq_len, num_params = int(k), int(per_rank_batch), int(seq_len), int(num_params)
    intra_l, inter_l = get_link(intra), get_link(inter)
    g = check_int("gpus_per_node", gpus_per_node)
    t_comm = hierarchical_allreduce_seconds(GRAD_BYTES_PER_PARAM * num_params, k, g, intra_l, inter_l)
    nodes = max(1, k // g)
    return _assemble(k, per_rank_batch, seq_len, num_params, rate, t_compute, t_comm, tokens,
                     intra_l, nodes=nodes, gpus_per_node=min(k, g),
                     inter=inter_l if nodes > 1 else None)


def scaling_curve(ks=None, *, per_rank_batch: int, seq_len: int, single_tokens_per_s: float,
                  num_params: int, gpus_per_node: int = 8, intra=REFERENCE_LINK,
                  inter="ib-ndr400") -> list[Estimate]:
    """``predict_hierarchical`` for every k in ``ks`` (default 1, 2, 4, ..., 1024)."""
    ks = tuple(2 ** i for i in range(11)) if ks is None else tuple(ks)
    if not ks:
        raise ValueError("ks is empty; give at least one GPU count")
    return [predict_hierarchical(k, per_rank_batch, seq_len, single_tokens_per_s, num_params,
                                 gpus_per_node=gpus_per_node, intra=intra, inter=inter) for k in ks]


def predictions(per_rank_batch: int, seq_len: int, single_tokens_per_s: float, num_params: int,
                link=REFERENCE_LINK, ks=PREDICT_KS) -> list[Estimate]:
    """``predict`` for each k in ``ks`` (default 2, 4, 8): what a build prints before launching."""
    return [predict(k, per_rank_batch, seq_len, single_tokens_per_s, num_params, link) for k in ks]


def announce(preds, label: str = "", file=None) -> str:
    """Print (and return) one line per prediction, prefixed with ``label``; flushed at once,
    so the prediction is on screen before the launch that tests it."""
    text = "\n".join(f"{label + ' ' if label else ''}{p.line()}" for p in preds)
    print(text, file=file, flush=True)
    return text


def prediction(preds, link, single_tokens_per_s: float, source: str, settled,
               unit: str = "device") -> Prediction:
    """The ``Prediction`` a data-parallel rung records before any launch: ``preds`` (from
    ``predictions``, its first point the rung's own k) and what they assumed. ``unit`` names
    the single-rank measurement in the assumption keys ("gpu" for PyTorch, "device" for JAX)."""
    return Prediction(model="ring all-reduce of the fp32 gradients after the step, no overlap",
                      predicted_tokens_per_s=preds[0].predicted_tokens_per_s,
                      points=[p.to_dict() for p in preds],
                      assumptions={"link": get_link(link).to_dict(),
                                   f"single_{unit}_tokens_per_s": single_tokens_per_s,
                                   f"single_{unit}_source": source,
                                   f"single_{unit}_settled": settled})
