"""R5 in PyTorch with OS processes on CPU (gloo): the fast form under DDP and FSDP2 with 2 ranks,
predicted before it is launched, and two "nodes" joined by torchrun's rendezvous. The chapter's
form under DDP with 4 ranks (the chapter's four-GPU point), its baseline launched first, is the
R5 benchmark's smoke run (tests/benchmarks/test_r5.py), checked there rank by rank.

Four processes only where they are cheap: the chapter's form runs eager (no compile), so a
fourth rank costs a few seconds; the compiled and the JAX runs stay at two, where each extra
process would pay its own compilation on the suite's two cores."""
import json
import socket
import subprocess
import sys
import tempfile

import pytest

from perfladder.config import get_config
from perfladder.multigpu.measurement import baseline_from_windows
from perfladder.torch.parallel import measure as dataparallel
from perfladder.torch.parallel.launch import rank_env
from perfladder.torch.rungs.recipes import fast_recipe

pytestmark = pytest.mark.multiprocess
CFG = get_config("smoke")
TIMING = dict(warmup=1, timed=2, windows=2)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_fast_form_runs_the_recipe_it_is_given(parallel, tmp_path, monkeypatch):
    # the fast recipe minus torch.compile: inductor's CPU compile would dominate a 2-core test
    recipe = fast_recipe(CFG).replace(compiled=False)
    base = baseline_from_windows([1000.0, 1000.0])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))    # where its temporary folder goes
    m = dataparallel.measure(2, CFG, "fast", recipe, parallel=parallel, baseline=base,
                             backend="gloo", timeout=300, **TIMING)
    assert m.status == "measured", m.reason
    assert not list(tmp_path.iterdir())          # the ranks' files went with the launch
    assert m.mechanism == parallel and m.per_rank_batch == 4 * CFG.big_batch
    assert (m.recipe["bf16"], m.recipe["optimizer"], m.recipe["embed"]) == (True, "fused", "onehot")
    assert {r["parallel"] for r in m.ranks} == {parallel}
    # every rank's reduced gradient was the combined batch's before anything was timed (bf16)
    assert all(r["allreduce_gate"]["passed"] and r["allreduce_gate"]["detail"]["precision"] == "bf16"
               for r in m.ranks)
    assert m.efficiency_vs_linear == pytest.approx(m.measured_tokens_per_s / 2000.0)


@pytest.mark.parametrize("rdzv", ["static", "c10d"])
def test_two_nodes_meet_at_one_endpoint(tmp_path, rdzv):
    """Two torchrun invocations, one per "node", meeting at one endpoint: the command a
    user types on two machines (docs/running.md, "Several machines"), here on one. 'static' fixes
    each node's rank (--node-rank); 'c10d' lets the rendezvous assign them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for node in (0, 1):
        how = (["--node-rank", str(node)] if rdzv == "static" else
               ["--rdzv-backend", "c10d", "--rdzv-id", "perfladder-test"])
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               *how, "--rdzv-endpoint", f"127.0.0.1:{port}",
               "-m", "perfladder.torch.parallel.launch", "--config", "smoke", "--form", "seed",
               "--backend", "gloo", "--warmup", "1", "--timed", "2", "--windows", "2",
               "--out", str(tmp_path / f"node{node}")]
        procs.append(subprocess.Popen(cmd, env=rank_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
    written = [n for n in ("node0", "node1") if (tmp_path / n / "ranks.json").exists()]
    assert len(written) == 1                            # by rank 0, on whichever node holds it
    if rdzv == "static":
        assert written == ["node0"]                     # --node-rank 0 holds rank 0
    ranks = json.loads((tmp_path / written[0] / "ranks.json").read_text())
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    assert ranks[0]["init_digest"] == ranks[1]["init_digest"]
    assert all(r["tokens_per_s"] > 0 and r["bus_bw"] > 0 for r in ranks)
