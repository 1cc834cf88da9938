"""The data-parallel cost model: its two terms, their structure, and its input checks."""
import pytest

from perfladder.multigpu import costmodel
from perfladder.multigpu.costmodel import (
    LINKS,
    Link,
    hierarchical_allreduce_seconds,
    predict,
    predict_hierarchical,
    predictions,
    ring_allreduce_seconds,
    scaling_curve,
)

N = 18_929_664            # the chapter's GPT (any size would do: the tests compare)
ARGS = dict(per_rank_batch=64, seq_len=128, single_tokens_per_s=550_000.0, num_params=N)


def test_ring_allreduce_moves_2_k_minus_1_over_k_of_the_bytes():
    assert ring_allreduce_seconds(4e9, 2, 4e9) == pytest.approx(1.0)          # 2 * 1/2 * 4e9 / 4e9
    assert ring_allreduce_seconds(4e9, 4, 4e9) == pytest.approx(1.5)
    assert ring_allreduce_seconds(4e9, 1, 4e9) == 0.0                          # nothing to sum


def test_prediction_terms_and_floor():
    p = predict(2, 64, 128, 8192.0, 1_000_000_000, Link("test", 4e9, "intra-node", "", ""))
    assert p.grad_bytes == 4_000_000_000                                        # fp32 gradients
    assert p.t_compute_s == pytest.approx(1.0)                                  # 64*128 / 8192
    assert p.t_comm_s == pytest.approx(1.0)
    assert p.linear_tokens_per_s == pytest.approx(2 * 8192)
    assert p.predicted_tokens_per_s == pytest.approx(2 * 8192 / 2)              # no overlap
    assert p.efficiency == pytest.approx(0.5)
    assert p.predicted_tokens_per_s <= p.linear_tokens_per_s
    assert any("fp32 gradients" in a for a in p.assumptions)
    assert "k=2" in p.line() and "50.0%" in p.line()


def test_one_device_is_linear():
    p = predict(1, **ARGS, link="pcie-host-staged")
    assert p.t_comm_s == 0 and p.efficiency == 1.0


def test_efficiency_falls_with_k_on_a_fixed_link():
    for link in ("nvlink4-h200", "pcie-host-staged"):
        effs = [p.efficiency for p in predictions(**ARGS, link=link, ks=(2, 4, 8, 16))]
        assert effs == sorted(effs, reverse=True) and effs[0] > effs[-1]


def test_faster_link_and_bigger_batch_both_help():
    slow, fast = (predict(2, **ARGS, link=name) for name in ("pcie-host-staged", "nvlink4-h200"))
    assert fast.efficiency > slow.efficiency and fast.t_compute_s == slow.t_compute_s
    big = predict(2, **{**ARGS, "per_rank_batch": 2048}, link="pcie-host-staged")
    assert big.t_comm_s == slow.t_comm_s                       # same gradient bill ...
    assert big.efficiency > slow.efficiency                    # ... over more compute


def test_hierarchical_is_a_flat_ring_inside_a_node_and_slower_across_nodes():
    S = 4 * N
    inside = hierarchical_allreduce_seconds(S, 8, 8, "nvlink4-h200", "ib-ndr400")
    assert inside == pytest.approx(ring_allreduce_seconds(S, 8, LINKS["nvlink4-h200"].bus_bytes_per_s))
    across = hierarchical_allreduce_seconds(S, 16, 8, "nvlink4-h200", "ib-ndr400")
    assert across > inside
    # the inter-node ring carries 1/8 of the bytes per GPU: cheaper than a flat ring on IB
    assert across < ring_allreduce_seconds(S, 16, LINKS["ib-ndr400"].bus_bytes_per_s)
    assert predict_hierarchical(8, **ARGS).efficiency == pytest.approx(
        predict(8, **ARGS, link="nvlink4-h200").efficiency)


def test_scaling_curve_structure():
    curve = scaling_curve(**ARGS)
    assert [p.k for p in curve] == [2 ** i for i in range(11)]               # 1 .. 1024
    assert [p.nodes for p in curve] == [1, 1, 1, 1, 2, 4, 8, 16, 32, 64, 128]
    effs = [p.efficiency for p in curve]
    assert effs == sorted(effs, reverse=True) and effs[0] == 1.0
    assert curve[4].inter_link == "ib-ndr400" and curve[3].inter_link is None
    rates = [p.predicted_tokens_per_s for p in curve]
    assert rates == sorted(rates)                                            # still more in total
    assert all(p.predicted_tokens_per_s <= p.linear_tokens_per_s for p in curve)


def test_whole_nodes_only_across_nodes():
    with pytest.raises(ValueError, match=r"k=12 .* gpus_per_node=8; valid choices"):
        predict_hierarchical(12, **ARGS)
    assert predict_hierarchical(6, **ARGS).nodes == 1                        # inside a node: any k


@pytest.mark.parametrize("k", [0, -2, 1.5, True, "2"])
def test_bad_k(k):
    with pytest.raises(ValueError, match="k="):
        predict(k, **ARGS)


@pytest.mark.parametrize("field,value", [("per_rank_batch", 0), ("seq_len", True),
                                         ("num_params", 2.5), ("single_tokens_per_s", 0.0),
                                         ("single_tokens_per_s", float("nan"))])
def test_bad_inputs_name_themselves(field, value):
    with pytest.raises(ValueError, match=field):
        predict(2, **{**ARGS, field: value})


def test_bad_link_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"'nvlink5'.*nvlink4-h200.*pcie-host-staged.*ib-ndr400"):
        predict(2, **ARGS, link="nvlink5")
    with pytest.raises(ValueError, match="'infiniband'"):
        scaling_curve(**ARGS, inter="infiniband")


def test_every_link_states_its_source():
    for link in LINKS.values():
        assert link.bus_bytes_per_s > 0 and link.source and link.scope in costmodel.SCOPES


def test_announce_prints_before_returning(capsys):
    text = costmodel.announce(predictions(**ARGS), label="R5")
    out = capsys.readouterr().out
    assert out.strip() == text and [l.split()[2] for l in out.splitlines()] == ["k=2:", "k=4:", "k=8:"]


def test_numpy_integers_are_integers():
    import numpy as np
    assert predict(np.int64(4), **ARGS) == predict(4, **ARGS)
    assert [p.k for p in scaling_curve(np.array([1, 8, 16]), **ARGS)] == [1, 8, 16]


# -- which link a machine is priced with --------------------------------------------------------
def _committed_nvlink_matrix() -> str:
    """`nvidia-smi topo -m` as read on the 2x H200 box of a committed R5 run (NV18 between them)."""
    import json
    from pathlib import Path
    doc = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200x2-r5"
                      / "r5.json").read_text())
    return doc["hardware"]["topology"]


def test_the_machines_link_is_read_from_its_gpus_connection_matrix(monkeypatch):
    nvlink = _committed_nvlink_matrix()
    pcie = nvlink.replace("NV18", "SYS")            # the same two GPUs joined over PCIe and the CPUs
    assert "NV#" in pcie                               # the legend names NVLink on every box
    monkeypatch.setattr(costmodel, "gpu_topology", lambda: pytest.fail("one GPU has no link to read"))
    assert costmodel.machine_link(0) == "gloo-loopback"
    assert costmodel.machine_link(1) == costmodel.REFERENCE_LINK == "nvlink4-h200"
    assert costmodel.machine_link(2, nvlink) == "nvlink4-h200"
    assert costmodel.machine_link(2, pcie) == "pcie-host-staged"
    monkeypatch.setattr(costmodel, "gpu_topology", lambda: nvlink)    # read here when not given
    assert costmodel.machine_link(4) == "nvlink4-h200"
    monkeypatch.setattr(costmodel, "gpu_topology", lambda: None)      # no nvidia-smi: the slow case
    assert costmodel.machine_link(2) == "pcie-host-staged"
    for link in ("gloo-loopback", "nvlink4-h200", "pcie-host-staged"):
        assert link in LINKS
    with pytest.raises(ValueError, match=r"gpu_count=-1"):
        costmodel.machine_link(-1)


def test_both_sides_and_the_r5_tool_price_the_machine_the_same_way(monkeypatch):
    """PyTorch's default link, the JAX rung's and the R5 tool's are all ``machine_link``: no
    other module names a link for the machine it runs on."""
    import importlib.util
    import re
    from pathlib import Path

    import torch

    from perfladder.torch.parallel import measure as torch_dp
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setattr(costmodel, "gpu_topology", lambda: _committed_nvlink_matrix().replace("NV18", "PIX"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert torch_dp.default_link("nccl") == "pcie-host-staged"
    assert torch_dp.default_link("gloo") == "gloo-loopback"
    spec = importlib.util.spec_from_file_location("r5_multi_gpu", root / "benchmarks" / "r5_multi_gpu.py")
    r5 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(r5)
    assert r5.detect_link({"gpus": ["0, NVIDIA H200", "1, NVIDIA H200"],
                           "topology": _committed_nvlink_matrix()}) == "nvlink4-h200"
    assert r5.detect_link({"gpus": ["0, NVIDIA H200", "1, NVIDIA H200"], "topology": None}) == "pcie-host-staged"
    assert r5.detect_link({"gpus": [], "topology": None}) == "gloo-loopback"
    named = [str(p.relative_to(root)) for p in (root / "src" / "perfladder").rglob("*.py")
             if re.search(r"""["']nvlink4-h200["']""", p.read_text())]
    assert named == ["src/perfladder/multigpu/costmodel.py"]
