"""Shared test fixtures (framework-free: importing this file must not import torch or jax)."""
from __future__ import annotations

import datetime
import importlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")   # no display on the test machine
from perfladder.config import gpu_present  # noqa: E402  (framework-free)

if not gpu_present():
    # CPU: the suite already keeps every core busy (two xdist workers beside the book build), so
    # inductor's pool of compile workers -- each importing torch -- only adds work; compile in
    # the process that asks (the book build and every subprocess inherit this)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    # and for the same reason one OpenMP thread per process (torch's intra-op pool, OpenBLAS
    # under numpy and the Triton interpreter): a second thread finds no idle core and spins
    # waiting for its partner, for smoke-sized ops that gain nothing from it (on two busy
    # cores the interpreted fused-kernel cases took 1.7x the CPU with two threads, a two-node
    # torchrun 1.3x). The ranks of a launch get one anyway (perfladder.torch.parallel.launch);
    # a lab that finds several drops to one itself (tests/torch/test_lab.py plants several)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # inductor's C++ kernels scalar, as a smoke lab on a CPU makes them
    # (perfladder.torch.compiler, which this framework-free file does not import): for the tests
    # that compile without a lab too, and the processes they start
    os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
    # and XLA's LLVM optimisations off for every JAX compile of the session, as a smoke lab on a
    # CPU turns them off (perfladder.jax.compiler.FAST_COMPILE_FLAG, about 3x cheaper compiles):
    # a test module that calls fast_cpu_compiles() at import is too late once another module's
    # collection has started JAX's backend (a skipif asking jax.default_backend(), say), and
    # every xdist worker imports every module before its first test
    if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()
# The fault tests send SIGINT to a build or a ladder, as a reader's Ctrl-C does. A suite started
# in the background by a non-interactive shell (`make test &`, nohup) inherits SIGINT ignored,
# and so would every process it starts, which then rightly ignores the test's signal: give the
# children the terminal's disposition back (a Python handler here is reset to the default in
# a child at exec; an ignored one is not)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# the tests mirror src/ in folders and are imported by path (--import-mode=importlib); the
# shared helpers (conftest, _ladders, ...) stay importable by name from this folder
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

from perfladder.measure.evidence import Timing  # noqa: E402
from perfladder.results.record import LadderResult, RungResult  # noqa: E402


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Backstop for the ``gpu`` marker: skip GPU-only tests when no CUDA GPU is present.

    Each GPU test also carries its own ``skipif``; this only makes sure that a forgotten
    one skips cleanly on the CPU machine instead of failing there.

    Also moves the modules that read the smoke book to the end of the session (in their
    order), so that the book builds in the background while the other tests run
    (``BookBuild``). It runs after ``-m`` and ``-k`` have deselected (``trylast``): a run
    without the book's readers (``-m "not slow"``) starts no book build.
    """
    late = {it.module for it in items if BOOK_FIXTURES & set(it.fixturenames)}
    early = [it for it in items if it.module not in late]
    seed = os.environ.get("PERFLADDER_TEST_SHUFFLE", "")
    if seed:   # opt-in: the tests before the book's readers in a random order (the same in every
        # worker), to find a test that passes only after another
        import random
        random.Random(seed).shuffle(early)
    items[:] = early + [it for it in items if it.module in late]
    if _xdist_uid(config) and any("smoke_book" in it.fixturenames for it in items):
        BookBuild.OUT.mkdir(parents=True, exist_ok=True)     # the controller starts the build
        BookBuild.files(_xdist_uid(config))["needed"].touch()
    gpu_items = [it for it in items if it.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    from perfladder.config import gpu_present
    if gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    for it in gpu_items:
        it.add_marker(skip)


def _xdist_uid(config) -> str:
    """The run id an xdist worker shares with its controller and the other workers ('' when
    the session runs in one process)."""
    return getattr(config, "workerinput", {}).get("testrunuid", "")


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (``make test``): two workers on a CPU machine, so that the tests use both
    cores while the book builds beside them; none where a GPU is present, whose tests time
    things on one device and must not share it."""
    from perfladder.config import gpu_present
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 0 if gpu_present() or cores < 2 else min(cores, 4)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The xdist controller: start the one book build as soon as a worker has collected a test
    that reads it (the workers wait for it; the controller stops it at the end of the session)."""
    uid = node.workerinput["testrunuid"]
    if BookBuild.files(uid)["needed"].exists():
        BookBuild.start(uid)


def pytest_collection_finish(session):
    """Start the book build now when a selected test will read it and no GPU is present: the
    build (one CPU core, most of its time) overlaps the tests that run before the book's
    readers. On a GPU it starts when first needed, so that it never shares the device with
    the GPU tests' timings. Under xdist the controller starts it instead (above)."""
    if session.config.option.collectonly or _xdist_uid(session.config):
        return
    if any("smoke_book" in it.fixturenames for it in session.items):
        from perfladder.config import gpu_present
        if not gpu_present():
            BookBuild.start()


def pytest_sessionfinish(session):
    BookBuild.stop()       # a session that ended early leaves no build running


# PERFLADDER_TEST_CPU=<file>: each test's CPU seconds (this process and the children it waited
# for, setup and teardown included) appended to <file> as "seconds<TAB>node id", and the book
# build's wall, user and system seconds in <file>.book: where the suite's time goes, whatever else loads the machine
CPU_LOG = os.environ.get("PERFLADDER_TEST_CPU", "")


def _cpu_s() -> float:
    import resource
    return sum(u.ru_utime + u.ru_stime for u in
               (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not CPU_LOG:
        yield
        return
    t0 = _cpu_s()
    yield
    with open(CPU_LOG, "a") as f:
        f.write(f"{_cpu_s() - t0:.2f}\t{item.nodeid}\n")


ROOT = Path(__file__).resolve().parents[1]
# fixtures that read the smoke book (the ladders do when the session builds it)
BOOK_FIXTURES = {"smoke_book", "torch_smoke_ladder", "jax_smoke_ladder"}


@dataclass(frozen=True)
class SmokeBook:
    """The test suite's one book build: its log and where its outputs are."""
    log: str
    out: Path                    # PERFLADDER_BOOK_OUT: holds _build/
    started: str = ""            # when the build began (UTC, as LadderResult.created writes it)

    @property
    def html(self) -> Path:
        return self.out / "_build" / "html"

    @property
    def results(self) -> Path:   # what the ladder notebooks wrote (torch.json, jax.json, PNGs)
        return self.out / "_build" / "results"

    def executed(self, name: str) -> Path:
        """The executed copy of notebooks/<name>.ipynb, outputs included (myst-nb writes it)."""
        return self.out / "_build" / "jupyter_execute" / "notebooks" / f"{name}.ipynb"

    def notebook(self, name: str):
        """That executed notebook (nbformat), after checking that every code cell ran and
        none printed an error."""
        import nbformat
        nb = nbformat.read(self.executed(name), as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code and all(c.execution_count is not None for c in code), f"{name}: not every cell ran"
        errors = [o for c in code for o in c.outputs if o.output_type == "error"]
        assert not errors, f"{name}: error outputs {[e.get('ename') for e in errors]}"
        return nb


class BookBuild:
    """The session's one smoke build of the book: ``scripts/build_book.sh`` with the smoke
    config into ``_build/test/`` (a GPU build in ``_build/`` is never touched), started once
    (``start``: in the background), waited for by ``smoke_book``.

    ``PERFLADDER_BOOK_FRESH=1`` empties the notebook cache first, so every notebook runs top to
    bottom in a fresh kernel (myst-nb executes through jupyter-cache and nbclient) in this
    build."""
    OUT = ROOT / "_build" / "test"
    TIMEOUT_S = 1500
    proc: subprocess.Popen | None = None
    uid = ""                     # the xdist run whose workers wait for this build
    started = ""                 # UTC, as LadderResult.created writes it
    t0 = 0.0

    @classmethod
    def files(cls, uid: str) -> dict[str, Path]:
        """What an xdist run shares about its build: a worker's request for it, when it
        started, and its exit status (written when it ends)."""
        return {k: cls.OUT / f".book-{k}-{uid}" for k in ("needed", "started", "rc")}

    @classmethod
    def start(cls, uid: str = "") -> None:
        if cls.proc is not None:
            return
        env = {**os.environ, "PERFLADDER_CONFIG": "smoke", "PERFLADDER_BOOK_OUT": str(cls.OUT),
               "PERFLADDER_BOOK_FRESH": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("PERFLADDER_RESULTS_DIR", None)          # the build script sets its own
        cls.OUT.mkdir(parents=True, exist_ok=True)
        cls.uid, cls.started, cls.t0 = uid, _utc_now(), time.monotonic()
        cmd = ["bash", str(ROOT / "scripts" / "build_book.sh"), sys.executable]
        if CPU_LOG:      # its wall, user and system seconds, beside the tests' (CPU_LOG below)
            cmd = ["/usr/bin/time", "-f", "%e %U %S", "-o", f"{CPU_LOG}.book", *cmd]
        if uid:      # the workers learn the build's end and status from a file
            files = cls.files(uid)
            files["started"].write_text(cls.started)
            cmd = ["bash", "-c", '"$@"; rc=$?; echo $rc > "$RC.tmp" && mv "$RC.tmp" "$RC"; exit $rc',
                   "book", *cmd]
            env["RC"] = str(files["rc"])
        with open(cls.OUT / "build.log", "w") as log:   # a file: nobody reads a pipe meanwhile
            cls.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    @classmethod
    def wait_for_controller(cls, uid: str) -> "SmokeBook":
        """An xdist worker: wait for the build the controller started to end."""
        files, t0 = cls.files(uid), time.monotonic()
        while not files["rc"].exists():
            waited = time.monotonic() - t0
            if waited > cls.TIMEOUT_S:
                pytest.fail(f"book build did not finish within {cls.TIMEOUT_S}s")
            if waited > 120 and not files["started"].exists():
                pytest.fail("the xdist controller never started the book build")
            time.sleep(1)
        rc = int(files["rc"].read_text())
        log = (cls.OUT / "build.log").read_text()
        assert rc == 0, f"book build failed (exit {rc}); log tail:\n{log[-6000:]}"
        return SmokeBook(log=log, out=cls.OUT, started=files["started"].read_text())

    @classmethod
    def wait(cls) -> "SmokeBook":
        cls.start()
        try:
            rc = cls.proc.wait(timeout=max(1.0, cls.TIMEOUT_S - (time.monotonic() - cls.t0)))
        except subprocess.TimeoutExpired:
            cls.stop()
            pytest.fail(f"book build did not finish within {cls.TIMEOUT_S}s")
        log = (cls.OUT / "build.log").read_text()
        assert rc == 0, f"book build failed (exit {rc}); log tail:\n{log[-6000:]}"
        return SmokeBook(log=log, out=cls.OUT, started=cls.started)

    @classmethod
    def stop(cls) -> None:
        if cls.proc is not None and cls.proc.poll() is None:
            os.killpg(cls.proc.pid, signal.SIGTERM)      # the script, sphinx and the notebook kernels
            cls.proc.wait()
        if cls.uid:
            for f in cls.files(cls.uid).values():
                f.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def smoke_book(request) -> SmokeBook:
    """The whole book, built once per session (``BookBuild``): the book tests read its HTML,
    the notebook tests its executed notebooks, and the ladder tests the results they wrote
    (``torch_smoke_ladder``). One execution serves all, the xdist workers included."""
    uid = _xdist_uid(request.config)
    return BookBuild.wait_for_controller(uid) if uid else BookBuild.wait()


def _utc_now() -> str:
    """Now, in the format of ``LadderResult.created`` (so the two compare as strings)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def timing_of(windows, *, stable: bool = True, settled: int | None = None,
              target_spread: float = 0.03) -> Timing:
    """A ``Timing`` of the given windows (tokens/s), one second each, 10 steps per window."""
    windows = [float(w) for w in windows]
    return Timing(windows=windows, seconds=[1.0] * len(windows),
                  settled=settled or len(windows), stable=stable, target_spread=target_spread,
                  steps_per_window=10, warmup=5, batch_shape=[64, 128])


def make_result(framework: str = "torch", device: str = "NVIDIA H200",
                rates=(100_000.0, 250_000.0, 200_000.0, 600_000.0),
                names=None, config_name: str = "full") -> LadderResult:
    """A synthetic version-2 ladder: one waterfall rung per rate, each building on the one
    before (windows +-1% around its rate, settled), plus a control on the baseline and a
    skipped R5.

    With the default rates, R2 (200k after R1's 250k) is the negative rung ('slower').
    """
    names = names or [f"R{i}" for i in range(len(rates))]
    res = LadderResult(framework=framework, device=device,
                       config={"name": config_name, "num_hiddens": 512}, baseline=names[0],
                       versions={"python": "3.11"}, command="pytest")
    for i, (n, t) in enumerate(zip(names, rates)):
        res.add(RungResult(name=n, key=n.lower(), label=f"step {i}", tokens_per_s=t,
                           timing=timing_of([0.99 * t, t, 1.01 * t]),
                           builds_on=names[i - 1] if i else None,
                           stage="beyond" if n.startswith("B") else "seed",
                           batch_size=64, seq_len=128, precision="bf16" if i else "tf32",
                           tflops=t * 1e8 / 1e12, mfu=None, notes=[f"note {i}"]))
    res.add(RungResult(name="R3c", key="fp32_control", label="fp32 control",
                       tokens_per_s=rates[0] * 1.5, timing=timing_of([rates[0] * 1.5]),
                       kind="control", precision="fp32", builds_on=names[0]))
    res.add(RungResult(name="R5", key="data_parallel", label="data parallel", kind="skipped",
                       stage="multi-gpu", error="one device: not applicable"))
    return res


@dataclass(frozen=True)
class SmokeLadder:
    """One framework's whole smoke ladder -- every default rung, the kernel report and the
    learning check -- and who ran it: ``command`` is what that runner passed as the ladder's
    command (a test checks the result recorded it). Treat ``result`` as read-only."""
    result: LadderResult
    command: str
    source: str                  # where the result came from, for failure messages


# what perfladder.pages.ladder.LadderPage passes as the command of the ladder a book build runs
BOOK_COMMAND = "perfladder.pages.ladder.LadderPage({!r}) in a book build"


def _book_builds_this_session(request) -> bool:
    """Does a selected test of this session use the smoke book (``-m "not slow"`` deselects them all)?"""
    return any("smoke_book" in item.fixturenames for item in request.session.items)


def _smoke_ladder(request, framework: str) -> SmokeLadder:
    """The smoke ladder of ``framework``, run once per session.

    When the session builds the book, its ladder notebook has just run exactly this ladder
    (``LadderPage`` runs every default rung, the kernel report and the learning check, and
    ``page.save()`` writes the result): the tests read that JSON instead of running the same
    ladder a second time, which also checks that everything they inspect survives the file
    the book pages render from. Without the book (``-m "not slow"``, or a single test file)
    the ladder runs here, in-process.
    """
    if _book_builds_this_session(request):
        book = request.getfixturevalue("smoke_book")
        path = book.results / f"{framework}.json"
        result = LadderResult.read(path)
        assert result.created >= book.started, f"{path} is older than this session's book build"
        return SmokeLadder(result, BOOK_COMMAND.format(framework), f"{path} (the book build)")
    from perfladder.config import get_config
    run_ladder = importlib.import_module(f"perfladder.{framework}").run_ladder
    return SmokeLadder(run_ladder(get_config("smoke"), command="pytest"), "pytest", "run_ladder in-process")


@pytest.fixture(scope="session")
def torch_smoke_ladder(request) -> SmokeLadder:
    """The PyTorch smoke ladder (``_smoke_ladder``), shared by tests/torch/test_lab.py and
    tests/torch/test_beyond.py."""
    pytest.importorskip("torch")
    return _smoke_ladder(request, "torch")


@pytest.fixture(scope="session")
def jax_smoke_ladder(request) -> SmokeLadder:
    """The JAX smoke ladder (``_smoke_ladder``), shared by tests/jax/test_rungs.py and
    tests/jax/test_beyond.py."""
    pytest.importorskip("jax")
    import shutil

    from perfladder.jax.compiler import fast_cpu_compiles
    if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles, shared on-disk cache
        fast_cpu_compiles()
    return _smoke_ladder(request, "jax")


@pytest.fixture
def synthetic_result():
    return make_result()


@pytest.fixture
def result_factory():
    return make_result
