"""The JAX backend of the ladder engine: ``JaxLab``.

``perfladder.ladder.engine`` runs rung declarations on a *lab*; this one knows JAX: the device and
versions, one on-device batch stream per batch size (continued from rung to rung, so no
batch is ever timed twice), how a ``Recipe`` becomes a model, its AdamW and a step, how a
step is timed (``measure``), profiled (``profile``) and planned by the compiler (``plan``),
and which technique code steps are built from (``code``: ``LIBRARY_CODE``, the step's
``perfladder.jax.step.CODE`` and R5's ``place_state``; ``use(name=fn)`` swaps in a reader's own
version for this and every later step, while the gates' references keep the library's).
"""
from __future__ import annotations

import gc
import tempfile
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from perfladder import compile_cache
from perfladder.config import LadderConfig, expected_num_params, flops_per_token
from perfladder.data import TimeMachine
from perfladder.hardware import peak_for, supports_bf16
from perfladder.jax.compiler import guard_compile_cache
from perfladder.jax.device import (
    capability,
    device_name,
    has_gpu,
    memory_room,
    memory_settings,
    versions,
)
from perfladder.jax.model import GPT
from perfladder.jax.parallel.layout import place_state
from perfladder.jax.program import planned_temp_bytes
from perfladder.jax.recipe import Recipe
from perfladder.jax.step import CODE, TrainStep, make_optimizer, traced_flops
from perfladder.jax.stream import Batches, batches
from perfladder.jax.timer import compile_count, throughput
from perfladder.kernels.accounting import recorded_report
from perfladder.ladder.fit import GIB, admit, check_plan, memory_cap_gib
from perfladder.ladder.lab import Measured
from perfladder.ladder.support import Kernels
from perfladder.measure.evidence import (
    PLANNED,
    Compile,
    Memory,
    ProfileSummary,
    Receipt,
)
from perfladder.measure.learning import LearningCheck
from perfladder.measure.timing import Stopwatch, WindowSettings, measure_settled, phase
from perfladder.results.record import LadderResult

# the techniques a page may hand the lab (``use``): the step's, and R5's layout of the state
LIBRARY_CODE = {**CODE, "place_state": place_state}

EAGER_WINDOWS = 2        # R0 is a price list, not a baseline: two short windows settle it
EAGER_MAX_WINDOWS = 4    # ... and it gives up early (an un-jitted step is slow)
PROFILE_STEPS = {"smoke": 2}   # steps under the profiler per rung; other configs: the default
DEFAULT_PROFILE_STEPS = 5
REPORT_STEPS = {"smoke": 2}    # ... and for the kernel report of the fastest configuration
DEFAULT_REPORT_STEPS = 5
REPORT_WARMUP, REPORT_TOP = 3, 12
PLAN_NOTE = "lower(...).compile().memory_analysis().temp_size_in_bytes"


@dataclass
class Plan:
    """What the compiler made of a step: matmul FLOPs of the traced step, planned temporaries,
    and the optimized module's text."""
    traced_flops: int
    temp_bytes: int | None
    text: str


class JaxLab:
    """Everything the JAX rungs share: data, streams, the device, the growing result."""

    framework = "jax"
    seed_top = "R3"

    def __init__(self, config: LadderConfig, command: str = "", probe: bool = True):
        if not isinstance(config, LadderConfig):
            raise TypeError(f"config must be a perfladder.config.LadderConfig, got {type(config).__name__}")
        self.config = config
        memory = memory_settings()     # before the backend starts, where it has not yet
        self.memory_cap_gib = memory_cap_gib()
        cached = _compile_cache_on_gpu()
        guard_compile_cache()
        self.data = TimeMachine(config.batch_size, config.num_steps, num_train=config.num_train,
                                num_val=config.num_val)
        self.gpt_config = config.gpt(vocab_size=len(self.data.vocab))
        self.on_gpu = has_gpu()
        self.device_name = device_name()
        # what the checks before each rung read of the card (``admit``); a test emulates
        # another card by setting it
        self.capability = capability()
        self.memory_prediction = None      # the running rung's (``admit``), said beside its plan
        peak = peak_for(self.device_name)
        roofs, notes = None, [self._check_flops(), "JAX device memory: " + "; ".join(memory)]
        if not self.on_gpu:
            notes.append("run on CPU: fp32 matmuls are plain fp32 (no TF32), MFU is not applicable, "
                         "cudnn attention is not available; roofs: no device probe on CPU")
        elif probe:
            from perfladder.jax.device import probe_roofs
            roofs = probe_roofs()
        if cached:
            notes.append("JAX's persistent compilation cache is on (a fresh folder for this process): "
                         "a rung's second lowering for the compiler's plan is a load")
        elif self.on_gpu and getattr(jax.config, "jax_compilation_cache_dir", None):
            notes.append(f"JAX's persistent compilation cache is on, in {jax.config.jax_compilation_cache_dir} "
                         "(set before this process: a book build's compile-ahead stage fills it)")
        self.result = LadderResult(
            framework="jax", device=self.device_name, config=config.to_dict(), baseline="R1",
            versions=versions(), command=command,
            peak_tflops=None if peak is None else {"bf16": peak.bf16, "tf32": peak.tf32},
            roofs=roofs, notes=notes, memory_cap_gib=self.memory_cap_gib)
        compile_cache.listen(lambda line: self.result.notes.append(line))
        self._streams: dict[int, Batches] = {}
        self.code = dict(LIBRARY_CODE)
        self.memo: dict = {}    # pure functions of (config, batch size): gate batches, references

    def _check_flops(self) -> str:
        """The FLOPs-per-token formula every rung's TFLOP/s and MFU use, against the dot count
        of the traced step (``perfladder.jax.step.count_flops``), once, before any rung:
        ``CountError`` if they disagree; the line the result keeps."""
        from perfladder.jax.step import count_flops
        from perfladder.measure.counts import check_flops
        g, T = self.gpt_config, self.config.num_steps
        (at_T, vector), (at_half, _) = count_flops(g, T), count_flops(g, T // 2)
        self.flop_check = check_flops(
            vector_params=vector, seq_len=T,
            formula=(self.flops_per_token(T), self.flops_per_token(T // 2)),
            counted=(at_T, at_half), counter="the jaxpr's dot_general FLOPs (traced_flops)")
        return (f"FLOPs per token at T={T} ({self.flops_per_token(T):,}) checked against "
                f"{self.flop_check['counter']} at start: equal")

    # -- the engine's interface -----------------------------------------------------------------
    def seed_recipe(self) -> Recipe:
        """R0's configuration: the un-jitted fp32 step at the seed batch."""
        return Recipe.seed(self.config)

    def recipe_from_dict(self, d: dict) -> Recipe:
        return Recipe.from_dict(d)

    def free(self) -> None:
        gc.collect()     # a rung's models and steps go before the next one builds its own

    def kernel_report(self, name: str, recipe: Recipe) -> dict:
        """The kernel breakdown (``KernelBreakdown.to_dict()``) of ``recipe``'s compiled step,
        profiled outside any timed window. Raises on failure (the engine records it)."""
        from perfladder.jax.kernels import kernel_breakdown
        step = self.build_step(recipe)
        stream = self.stream(recipe.batch_size)
        X, Y = next(stream)
        self.first_call(step, X, Y)
        kb = kernel_breakdown(step, stream, steps=REPORT_STEPS.get(self.config.name, DEFAULT_REPORT_STEPS),
                              warmup=REPORT_WARMUP, top=REPORT_TOP,
                              hlo_text=step.lower(X, Y).compile().as_text())
        step.commit()
        return recorded_report(kb, self.result.roofs, self.gpt_config, recipe,
                               seq=self.config.num_steps, framework="jax")

    def learning_check(self, name: str, recipe: Recipe, watch: Stopwatch | None = None) -> LearningCheck:
        """Train ``recipe`` from a fresh init on the learning split, judged on held-out text by
        the reference model (``perfladder.jax.evaluate``); a failed check is returned, not
        raised. ``watch``: seconds per part."""
        from perfladder.jax.evaluate import learning_check
        from perfladder.measure.learning import LearningError
        c = self.config
        with phase(watch, "data"):
            data = TimeMachine(recipe.batch_size, c.num_steps, num_train=c.learn_num_train,
                               num_val=c.num_val)
            stream = batches(data, recipe.batch_size, seed=c.seed + 1000)
        with phase(watch, "build"):
            step = self.build_step(recipe)
        try:
            check = learning_check(step, stream, data, model=step.model, steps=c.learn_steps,
                                   commit=step.commit, watch=watch)
        except LearningError as e:
            check = e.check
        return check

    # -- building blocks --------------------------------------------------------------------
    @property
    def profile_steps(self) -> int:
        return PROFILE_STEPS.get(self.config.name, DEFAULT_PROFILE_STEPS)

    def stream(self, batch_size: int) -> Batches:
        """The training stream of this batch size (one per size, continued across rungs)."""
        if batch_size not in self._streams:
            self._streams[batch_size] = batches(self.data, batch_size,
                                                seed=self.config.seed + len(self._streams))
        return self._streams[batch_size]

    def use(self, **code) -> None:
        """Build this and every later step with these technique functions (by name)."""
        unknown = sorted(set(code) - set(LIBRARY_CODE))
        if unknown:
            raise ValueError(f"no technique named {', '.join(unknown)}; valid choices: {', '.join(LIBRARY_CODE)}")
        bad = [k for k, f in code.items() if not callable(f)]
        if bad:
            raise TypeError(f"technique {bad[0]}={code[bad[0]]!r} must be a function")
        self.code.update(code)

    def model(self, recipe: Recipe, plain_code: bool = False) -> GPT:
        """A fresh model of the recipe: always the same init (``config.seed``), fp32 parameters,
        computing in ``recipe.dtype`` (``make_model``; ``plain_code``: the library's)."""
        code = CODE if plain_code else self.code
        kw = recipe.model_kw()
        kw["checkpoint"] = code["checkpoint_block"] if recipe.checkpoint else False
        return code["make_model"](self.gpt_config, jnp.dtype(recipe.dtype), self.config.seed, **kw)

    def build_step(self, recipe: Recipe, place=None, plain_code: bool = False) -> TrainStep:
        """A fresh model, its AdamW and the recipe's step, built with this lab's technique code
        (``plain_code``: the library's, as every gate's reference is). ``place(model,
        optimizer)`` lays the state out (e.g. over a device mesh) before the step is made."""
        if not isinstance(recipe, Recipe):
            raise TypeError(f"recipe must be a perfladder.jax.Recipe, got {type(recipe).__name__}")
        model = self.model(recipe, plain_code)
        optimizer = make_optimizer(model, self.config.lr)
        if place is not None:
            place(model, optimizer)
        return TrainStep.of(model, optimizer, recipe, code=CODE if plain_code else self.code)

    def measure(self, step, batch_size: int, *, stream=None, eager: bool = False) -> Measured:
        """``step`` timed on fresh batches (``stream``, default the training stream of
        ``batch_size``), measured once more when its windows did not settle (``Measured``: no
        memory, which the trial reads from the compiler's plan);
        an un-jitted step (``eager``) is measured once, briefly: a price list, not a baseline (on
        the H200 its second attempt cost 10 s and settled no better)."""
        c = self.config
        stream = self.stream(batch_size) if stream is None else stream
        # eager: nothing to compile past, one warm-up step, short windows (of 3 steps already:
        # a pilot would cost more than it saves)
        settings = WindowSettings.of(c, batch_size, **(dict(
            warmup=1, timed=c.eager_timed, windows=EAGER_WINDOWS, max_windows=EAGER_MAX_WINDOWS,
            window_s=None) if eager else {}))

        def once():
            return throughput(step, stream, settings)
        if eager:
            return Measured(once(), False)
        return Measured(*measure_settled(once, budget_s=c.timing_budget_s))

    def first_call(self, step, X, Y) -> tuple[Compile, jax.Array]:
        """The step's first (compiling) call, outside any timed window: ``(Compile, loss)``."""
        c0, t0 = compile_count(), time.perf_counter()
        loss = jax.block_until_ready(step(X, Y))
        return Compile(first_call_s=time.perf_counter() - t0, compilations=compile_count() - c0), loss

    def plan(self, step: TrainStep, X, Y) -> Plan:
        """The compiled step's plan (compiled again: a cache load where the cache is on)."""
        compiled = step.lower(X, Y).compile()
        return Plan(traced_flops=traced_flops(step.model, X, Y),
                    temp_bytes=planned_temp_bytes(compiled), text=compiled.as_text())

    def profile(self, step, stream, hlo_text: str | None = None, devices: int = 1) -> ProfileSummary:
        from perfladder.jax.profile import profile_step
        # CPU: the raw trace (tests/jax/test_kernels.py checks it agrees with the Perfetto JSON)
        # saves most of the second it takes to stop the profiler; a GPU keeps the JSON path
        return profile_step(step, stream, steps=self.profile_steps, hlo_text=hlo_text,
                            devices=devices, perfetto=self.on_gpu)

    def precision(self, recipe: Recipe) -> str:
        """What the matmuls run in: 'bf16', or 'tf32' (fp32 on a GPU with TF32, compute
        capability 8.0 on), or 'fp32' (CPU, older GPUs)."""
        if recipe.bf16:
            return "bf16"
        return "tf32" if self.on_gpu and supports_bf16(self.capability) else "fp32"

    # -- what the card can run and hold ----------------------------------------------------
    def admit(self, rung, given) -> None:
        """The engine's check before a rung runs: ``NotSupported`` (bf16 on a card without bf16
        tensor cores), ``NotApplicable`` (Pallas or cuDNN kernels it cannot run), ``DoesNotFit``
        (its predicted memory, ``perfladder.ladder.fit``, over what there is)."""
        self.memory_prediction = None
        self.memory_prediction = admit(self, rung, given, basis=self.result.rungs, must_match=("dtype", "checkpoint"),
                                       room=memory_room, held_bytes=self.held_bytes)

    def admit_plan(self, step: TrainStep, batch_size: int) -> None:
        """After the step compiled, before it runs: its compiled plan against the memory there
        is (``perfladder.ladder.fit.check_plan``: ``DoesNotFit``). On a CPU without a cap there
        is no limit to check against."""
        if step.compiled is None:
            return
        cap = None if self.memory_cap_gib is None else int(self.memory_cap_gib * GIB)
        room = memory_room(cap)
        if room is None:
            return
        check_plan(planned_temp_bytes(step.compiled), self.held_bytes, batch_size, room,
                   cap, self.memory_prediction)

    @property
    def held_bytes(self) -> int:
        """Device bytes the step holds beside its planned temporaries (its memory record): the
        fp32 parameters and AdamW's two moments it is handed and the new ones it returns."""
        return 2 * 12 * expected_num_params(self.gpt_config)

    @property
    def fixed_bytes(self) -> int:
        """Device bytes that do not grow with the batch: ``held_bytes`` and the gradients."""
        return self.held_bytes + 4 * expected_num_params(self.gpt_config)

    def kernels(self, recipe: Recipe) -> list[Kernels]:
        """What ``recipe``'s kernels need of a GPU: our Pallas kernels (compiled by Pallas's
        Triton backend, in bf16) and cuDNN's fused attention, both 8.0 or newer."""
        out = []
        if recipe.fused:
            out.append(Kernels(f"our Pallas kernels ({', '.join(recipe.fused)})", (8, 0)))
        if recipe.attn_impl == "cudnn":
            out.append(Kernels("cuDNN's fused attention", (8, 0)))
        return out

    def receipt(self, recipe: Recipe, step: TrainStep) -> Receipt:
        """The dtypes the timed step's forward computed in, as written while it was traced."""
        claimed = "bf16" if (recipe.bf16 or recipe.naive_cast) else self.precision(recipe)
        where = ("GPT.__call__ while the timed TrainStep was traced" if step.jitted
                 else "GPT.__call__ in the timed (un-jitted) TrainStep")
        if not step.observed:
            raise RuntimeError(f"the step recorded no dtypes ({where}): was it ever called?")
        observed = {k: v for k, v in step.observed.items() if k != "loss"}   # fp32 by design
        return Receipt(claimed=claimed, observed=observed, where=where)

    def flops_per_token(self, seq_len: int) -> int:
        g = self.gpt_config
        return flops_per_token(expected_num_params(g), g.num_blks, seq_len, g.num_hiddens)

    def planned(self, plan: Plan | None) -> Memory:
        if plan is None:
            return Memory(bytes=None, kind="n/a", note="an un-jitted step has no compiled plan")
        note = PLAN_NOTE
        if self.memory_prediction is not None:     # with the state it holds beside them
            note += f"; {self.memory_prediction.note()}, {self.held_bytes / 2**30:.2f} GiB of state included"
        return Memory(bytes=plan.temp_bytes, kind=PLANNED, note=note)

    def __repr__(self) -> str:
        return f"JaxLab({self.config.name}, {self.device_name}, ran={[r.name for r in self.result.rungs]})"


def _compile_cache_on_gpu() -> bool:
    """On a GPU, JAX's persistent compilation cache in a fresh folder (unless one is set), so
    that a rung's ``lower(...).compile()`` for the compiler's plan loads what its first call
    compiled. Nothing timed changes; compiles happen in warm-up either way."""
    if not has_gpu() or getattr(jax.config, "jax_compilation_cache_dir", None):
        return False
    jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="perfladder-jax-cache-"))
    return True

