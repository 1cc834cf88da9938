"""perfladder.book.execute: the ladder notebooks side by side, each on its own GPU and cores."""
from __future__ import annotations

import json
import os
import sys

import pytest

from perfladder.book import execute as bookexec


def _fake_topology(tmp_path, cores):
    """A /sys/devices/system/cpu with the given {cpu: (package, core)} map."""
    for cpu, (pkg, core) in cores.items():
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{pkg}\n")
        (topo / "core_id").write_text(f"{core}\n")
    return tmp_path


def test_hyperthread_siblings_stay_on_one_core(tmp_path):
    # Linux numbers the second hyperthread of each core after all the first ones: 0/4, 1/5, ...
    sysfs = _fake_topology(tmp_path, {c: (0, c % 4) for c in range(8)})
    cores = bookexec.physical_cores(range(8), sys_cpu=sysfs)
    assert cores == [[0, 4], [1, 5], [2, 6], [3, 7]]
    shares = bookexec.split_cores(2, cores)
    assert shares == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert not set(shares[0]) & set(shares[1])


def test_two_sockets_and_uneven_shares(tmp_path):
    sysfs = _fake_topology(tmp_path, {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (1, 2)})
    cores = bookexec.physical_cores([0, 1, 2, 3, 4], sys_cpu=sysfs)
    assert cores == [[0], [1], [2], [3], [4]]
    assert bookexec.split_cores(2, cores) == [[0, 1, 2], [3, 4]]


def test_without_topology_every_cpu_is_a_core(tmp_path):
    assert bookexec.physical_cores([3, 1], sys_cpu=tmp_path) == [[1], [3]]


@pytest.mark.parametrize("k", [0, -1, True, 1.5])
def test_bad_share_counts_are_refused(k):
    with pytest.raises(ValueError, match=repr(k).replace(".", r"\.")):
        bookexec.split_cores(k, [[0], [1]])


def test_more_notebooks_than_cores_is_an_error():
    with pytest.raises(ValueError, match="only 1 core"):
        bookexec.split_cores(2, [[0, 1]])


def test_cpu_ranges_read_like_taskset():
    assert bookexec.cpu_ranges([17, 0, 1, 2, 5, 16]) == "0-2,5,16-17"
    assert bookexec.cpu_ranges([3]) == "3"


def test_visible_gpus_follow_the_callers_mask(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert bookexec.visible_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert bookexec.visible_gpus() == []


def _notebook(path, source):
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, path)
    return path


REPORT = ("import os\n"
          "print('gpu', os.environ.get('CUDA_VISIBLE_DEVICES'))\n"
          "print('cpus', sorted(os.sched_getaffinity(0)))\n")


def test_side_by_side_pins_each_notebook_and_fills_the_cache(tmp_path):
    """Two notebooks run at once, each sees its own GPU mask and its own cores, and the
    build's cache then answers for both (as myst-nb asks it: by the notebook's code)."""
    pytest.importorskip("jupyter_cache")
    import nbformat
    from jupyter_cache import get_cache
    if len(bookexec.physical_cores()) < 2:
        with pytest.raises(ValueError, match="core"):
            bookexec.split_cores(2, bookexec.physical_cores())
        return
    nbs = [_notebook(tmp_path / f"{i}_nb.ipynb", f"# notebook {i}\n" + REPORT) for i in range(2)]
    cache = tmp_path / "cache"
    plan = bookexec.side_by_side(nbs, cache, tmp_path / "work", gpus=["7", "5"], timeout=120,
                                 log=lambda *a: None)
    seen = {}
    for nb in nbs:
        record = get_cache(str(cache)).match_cache_notebook(nbformat.read(nb, as_version=4))
        out = get_cache(str(cache)).get_cache_bundle(record.pk).nb
        text = "".join(o.get("text", "") for o in out.cells[0].outputs)
        seen[nb.name] = text
        assert plan[nb.name]["ran"] and plan[nb.name]["seconds"] > 0
        assert f"gpu {plan[nb.name]['gpu']}" in text
        assert f"cpus {plan[nb.name]['cpus']}" in text
        progress = [json.loads(line) for line in bookexec.progress_file(tmp_path / "work" / nb.name)
                    .read_text().splitlines()]
        assert progress == [{"phase": "start"}, {"phase": "cell", "index": 1, "of": 1, "timeout": 120},
                            {"phase": "finish"}]
    assert [plan[nb.name]["gpu"] for nb in nbs] == ["7", "5"]
    assert not set(plan[nbs[0].name]["cpus"]) & set(plan[nbs[1].name]["cpus"])
    rows = bookexec.status_rows(tmp_path / "work")
    assert [r[:3] for r in rows] == [(nb.name, plan[nb.name]["gpu"], bookexec.cpu_ranges(plan[nb.name]["cpus"]))
                                     for nb in nbs]
    assert bookexec.status_rows(tmp_path / "nothing-here") is None
    # a second call finds both cached and runs nothing
    again = bookexec.side_by_side(nbs, cache, tmp_path / "work2", gpus=["7", "5"], log=lambda *a: None)
    assert not any(v["ran"] for v in again.values())


def test_a_failing_notebook_fails_loudly_and_caches_nothing(tmp_path):
    pytest.importorskip("jupyter_cache")
    import nbformat
    from jupyter_cache import get_cache
    good = _notebook(tmp_path / "good.ipynb", "x = 1")
    bad = _notebook(tmp_path / "bad.ipynb", "raise RuntimeError('planted failure')")
    both = [good, bad] if len(bookexec.physical_cores()) >= 2 else [bad]
    with pytest.raises(RuntimeError, match=r"bad\.ipynb(.|\n)*planted failure"):
        bookexec.side_by_side(both, tmp_path / "cache", tmp_path / "work", gpus=None,
                              timeout=120, log=lambda *a: None)
    with pytest.raises(KeyError):
        get_cache(str(tmp_path / "cache")).match_cache_notebook(nbformat.read(good, as_version=4))


def test_cli_refuses_missing_gpus_and_notebooks(tmp_path, monkeypatch, capsys):
    nb = _notebook(tmp_path / "a.ipynb", "x = 1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(SystemExit):
        bookexec.main(["run", str(tmp_path / "c"), str(tmp_path / "w"), str(nb), str(nb)])
    assert "need 2 GPUs; found 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bookexec.main(["run", str(tmp_path / "c"), str(tmp_path / "w"), str(tmp_path / "nope.ipynb"), "--no-gpu"])
    assert "nope.ipynb" in capsys.readouterr().err


def test_build_script_refuses_a_bad_parallel_value(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PERFLADDER_BOOK_PARALLEL": "maybe", "PERFLADDER_BOOK_OUT": str(tmp_path)}
    p = subprocess.run(["bash", str(root / "scripts" / "build_book.sh"), sys.executable],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr == ("scripts/build_book.sh: PERFLADDER_BOOK_PARALLEL='maybe' is not valid; "
                        "valid: 1, true, yes, 0, false, no\n")
    assert not (tmp_path / "_build").exists()


def test_status_rows_are_this_builds_only(tmp_path, monkeypatch):
    """A side-by-side record of an earlier build is not shown as this build's."""
    import json
    plan = {"01_pytorch_ladder.ipynb": {"gpu": "0", "cpus": [0, 1], "seconds": 12.0, "ran": True}}
    (tmp_path / "side_by_side.json").write_text(json.dumps({**plan, "_build": "build-1"}))
    assert bookexec.status_rows(tmp_path, build="build-1") == [("01_pytorch_ladder.ipynb", "0", "0-1", "12 s")]
    assert bookexec.status_rows(tmp_path, build="build-2") is None
    monkeypatch.setenv("PERFLADDER_BUILD_ID", "build-2")
    assert bookexec.status_rows(tmp_path) is None
    (tmp_path / "side_by_side.json").write_text(json.dumps(plan))       # written before build ids
    assert bookexec.status_rows(tmp_path) is None


# A stand-in executor: it reports the phases it is given (0.3 s apart), registers for the
# watchdog's stack request as the real one does, starts a child in its session, then sleeps.
FAKE_EXECUTOR = """
import faulthandler, json, signal, subprocess, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)
nb, out, phases, then = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                          "signal.signal(signal.SIGUSR1, signal.SIG_IGN); time.sleep(600)"])
open(out + ".child", "w").write(str(child.pid))
for phase in phases:
    with open(out + ".progress", "a") as f:
        f.write(json.dumps(phase) + "\\n")
    time.sleep(0.3)
if then == "hang":
    time.sleep(600)
open(out, "w").write(open(nb).read())
open(out + ".json", "w").write(json.dumps({"seconds": 1.0}))
child.kill()
"""


def _fake_executors(monkeypatch, phases, then):
    monkeypatch.setattr(bookexec, "_worker_cmd", lambda nb, out, timeout: [
        sys.executable, "-c", FAKE_EXECUTOR, str(nb), str(out), json.dumps(phases), then])


def _alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"    # a zombie has ended
    except FileNotFoundError:
        return False


def _ends(pid, within=60.0):
    """Whether process ``pid`` ends within ``within`` seconds (a signal's delivery is not
    instant on a busy machine)."""
    import time
    deadline = time.monotonic() + within
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.timeout(120)
def test_a_stalled_executor_is_stopped_with_its_stacks_and_caches_nothing(tmp_path, monkeypatch):
    """An executor that outlives its phase's bound (nbclient's own plus the grace) is stopped,
    everything it started with it; the error names the notebook and the phase, and its log
    holds its Python stacks."""
    pytest.importorskip("jupyter_cache")
    monkeypatch.setattr(bookexec, "STARTUP_TIMEOUT", 30)    # a slow start on a busy machine is no stall
    _fake_executors(monkeypatch, [{"phase": "start"}, {"phase": "cell", "index": 2, "of": 5}], "hang")
    nb = _notebook(tmp_path / "stuck.ipynb", "x = 1")
    with pytest.raises(RuntimeError, match=r"stuck\.ipynb \(stalled in cell 2 of 5 for over 4 s") as e:
        bookexec.side_by_side([nb], tmp_path / "cache", tmp_path / "work", timeout=3, grace=1,
                              log=lambda *a: None)
    assert "File " in str(e.value) and "in <module>" in str(e.value)    # faulthandler's stack
    child = int((tmp_path / "work" / "stuck.ipynb.child").read_text())
    assert _ends(child)
    assert not (tmp_path / "work" / "side_by_side.json").exists()


@pytest.mark.timeout(120)
def test_the_watchdog_bounds_each_phase_not_the_whole_run(tmp_path, monkeypatch):
    """Fifteen cells 0.3 s apart take longer than one cell's bound (3 s) and still finish."""
    pytest.importorskip("jupyter_cache")
    phases = [{"phase": "start"}] + [{"phase": "cell", "index": i, "of": 15} for i in range(1, 16)] \
        + [{"phase": "finish"}]
    _fake_executors(monkeypatch, phases, "exit")
    nb = _notebook(tmp_path / "long.ipynb", "x = 1")
    monkeypatch.setattr(bookexec, "STARTUP_TIMEOUT", 30)
    plan = bookexec.side_by_side([nb], tmp_path / "cache", tmp_path / "work", timeout=2, grace=1,
                                 log=lambda *a: None)
    assert plan["long.ipynb"]["ran"]


def test_each_phase_gets_nbclients_own_bound_plus_the_grace():
    assert bookexec.phase_bound({"phase": "launch"}, 1800, 60) == bookexec.STARTUP_TIMEOUT + 60
    assert bookexec.phase_bound({"phase": "start"}, 1800, 60) == bookexec.STARTUP_TIMEOUT + 60
    assert bookexec.phase_bound({"phase": "cell", "index": 3, "of": 9}, 1800, 60) == 1860
    assert bookexec.phase_bound({"phase": "finish"}, 1800, 60) == 60
    # a notebook that sets its own cell timeout in its metadata (jupyter-cache honours it)
    assert bookexec.phase_bound({"phase": "cell", "index": 1, "of": 2, "timeout": 30}, 1800, 60) == 90
    no_limit = {"phase": "cell", "index": 1, "of": 2, "timeout": None}
    assert bookexec.phase_bound(no_limit, 1800, 60) == float("inf")


@pytest.mark.parametrize("timeout", [0, -5, 1.5, True])
def test_a_cell_timeout_must_be_a_positive_int(tmp_path, timeout):
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        bookexec.side_by_side([], tmp_path / "c", tmp_path / "w", timeout=timeout)


def test_cli_names_a_bad_timeout_in_one_line(tmp_path, capsys):
    nb = _notebook(tmp_path / "a.ipynb", "x = 1")
    rc = bookexec.main(["run", str(tmp_path / "c"), str(tmp_path / "w"), str(nb), "--no-gpu",
                        "--timeout", "0"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "timeout must be a positive number" in err and "got 0" in err


@pytest.mark.timeout(180)
def test_stopping_a_real_executor_takes_its_kernel_down(tmp_path):
    """The kernel runs in a session of its own (jupyter_client starts it so); it leaves when
    its executor is stopped, not ten minutes later."""
    pytest.importorskip("jupyter_cache")
    import subprocess
    import time
    marker = tmp_path / "kernel.pid"
    nb = _notebook(tmp_path / "sleeps.ipynb",
                   f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)")
    out = tmp_path / "sleeps.out.ipynb"
    p = subprocess.Popen(bookexec._worker_cmd(nb, out, 600), start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not marker.exists() or not marker.read_text():
        assert p.poll() is None, "the executor ended before its cell ran"
        time.sleep(0.2)
    kernel = int(marker.read_text())
    assert bookexec._last_phase(out) == {"phase": "cell", "index": 1, "of": 1, "timeout": 600}
    bookexec._stop(p, stacks=False)
    assert _ends(kernel)


@pytest.mark.parametrize("own, reported", [(45, 45), (-1, None)])
def test_a_notebooks_own_cell_timeout_is_the_one_reported(tmp_path, own, reported):
    pytest.importorskip("jupyter_cache")
    import nbformat
    nb = _notebook(tmp_path / "own.ipynb", "x = 1")
    doc = nbformat.read(nb, as_version=4)
    doc.metadata["execution"] = {"timeout": own}
    nbformat.write(doc, nb)
    assert bookexec.execute_one(nb, tmp_path / "own.out.ipynb", 120) == 0
    assert bookexec._last_phase(tmp_path / "own.out.ipynb") == {"phase": "finish"}
    lines = bookexec.progress_file(tmp_path / "own.out.ipynb").read_text().splitlines()
    assert json.loads(lines[1])["timeout"] == reported


@pytest.mark.timeout(120)
def test_when_one_notebook_fails_its_partner_is_stopped_not_waited_for(tmp_path, monkeypatch):
    """Nothing of a failed side-by-side run is cached, so a partner still running (here in a
    cell of ten minutes) is stopped and named, with the one that failed."""
    pytest.importorskip("jupyter_cache")
    if len(bookexec.physical_cores()) < 2:
        pytest.skip("two notebooks side by side need two cores")
    monkeypatch.setattr(bookexec, "STARTUP_TIMEOUT", 30)
    real = bookexec._worker_cmd
    long_cell = [{"phase": "start"}, {"phase": "cell", "index": 1, "of": 1}]
    fake = [sys.executable, "-c", FAKE_EXECUTOR]
    monkeypatch.setattr(bookexec, "_worker_cmd", lambda nb, out, timeout: real(nb, out, timeout)
                        if nb.name == "bad.ipynb" else
                        [*fake, str(nb), str(out), json.dumps(long_cell), "hang"])
    slow = _notebook(tmp_path / "slow.ipynb", "x = 1")
    bad = _notebook(tmp_path / "bad.ipynb", "raise RuntimeError('planted failure')")
    with pytest.raises(RuntimeError) as e:
        bookexec.side_by_side([slow, bad], tmp_path / "cache", tmp_path / "work", gpus=None,
                              timeout=600, log=lambda *a: None)
    assert "slow.ipynb (stopped when bad.ipynb failed)" in str(e.value)
    assert "bad.ipynb (exit 1)" in str(e.value) and "planted failure" in str(e.value)
    assert _ends(int((tmp_path / "work" / "slow.ipynb.child").read_text()))


def test_a_progress_line_being_written_is_not_read(tmp_path):
    out = tmp_path / "nb.ipynb"
    assert bookexec._last_phase(out) == {"phase": "launch"}
    bookexec.progress_file(out).write_text('{"phase": "start"}\n{"phase": "ce')
    assert bookexec._last_phase(out) == {"phase": "start"}
    bookexec.progress_file(out).write_text('{"pha')
    assert bookexec._last_phase(out) == {"phase": "launch"}
