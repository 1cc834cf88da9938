"""``TorchLab``: the PyTorch backend of the ladder engine (``perfladder.ladder.engine``).

It owns what every rung shares -- the data, the device, a fresh model / optimizer / step for
any ``Recipe``, the timer, the profiler, the growing ``LadderResult`` -- and turns one
measurement into a ``RungResult`` with its typed evidence. The rungs themselves are small
functions declared in ``rungs/``; each measures through ``perfladder.torch.trial.trial``.

``code`` holds the technique functions steps are built from (``perfladder.torch.step.CODE``
and the model's ``checkpoint_block``); ``use(name=fn)`` swaps in a reader's own version, for
this and every later step, and the gates' references keep the library's.
"""
from __future__ import annotations

import gc
import itertools

import torch

from perfladder import compile_cache
from perfladder.config import LadderConfig, expected_num_params, flops_per_token
from perfladder.data import TimeMachine
from perfladder.hardware import peak_for, supports_bf16
from perfladder.kernels.accounting import recorded_report
from perfladder.ladder.fit import admit, memory_cap_gib
from perfladder.ladder.lab import Measured
from perfladder.ladder.support import Kernels
from perfladder.measure.evidence import (
    PEAK_RESERVED,
    RESERVED_NOTE,
    Memory,
    ProfileSummary,
    Receipt,
)
from perfladder.measure.timing import Stopwatch, WindowSettings, measure_settled, phase
from perfladder.results.record import LadderResult
from perfladder.torch.compiler import fast_cpu_compiles, guard_compile_cache
from perfladder.torch.device import (
    apply_memory_cap,
    capability,
    device_name,
    memory_room,
    probe_roofs,
    triton_present,
    versions,
)
from perfladder.torch.fused import NOT_TRITON
from perfladder.torch.kernels import time_attention
from perfladder.torch.model import GPT, checkpoint_block
from perfladder.torch.parallel.worker import parallelize
from perfladder.torch.recipe import Recipe
from perfladder.torch.step import CODE, TrainStep, make_step
from perfladder.torch.stream import batches
from perfladder.torch.timer import throughput

LIBRARY_CODE = {**CODE, "checkpoint_block": checkpoint_block, "time_attention": time_attention,
                "parallelize": parallelize}


class TorchLab:
    """Data, device, steps from recipes, measurement and the ``LadderResult`` (``.result``)."""

    framework = "torch"
    baseline = "R0"
    seed_top = "R3"            # the last rung of the seed's recipe; beyond rungs start here

    def __init__(self, config: LadderConfig, device=None, command: str = "", probe: bool = True):
        if not isinstance(config, LadderConfig):
            raise TypeError(f"config must be a LadderConfig, got {type(config).__name__}")
        self.config = config
        guard_compile_cache()
        # each ladder compiles and times its own graphs: dynamo's code of an earlier ladder in
        # this process (a notebook cell run again) would otherwise serve its rungs, which would
        # record no compile and no cache events
        torch._dynamo.reset()
        device = device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(device)
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(f"device={device!r} is not supported; valid choices: 'cuda', 'cpu'")
        self.on_gpu = self.device.type == "cuda"
        torch.set_float32_matmul_precision("high")     # fp32 matmuls as TF32: the fair baseline
        self.data = TimeMachine(config.batch_size, config.num_steps,
                                num_train=config.num_train, num_val=config.num_val)
        self.gpt_config = config.gpt(vocab_size=len(self.data.vocab))
        self.num_params = expected_num_params(self.gpt_config)
        self.device_name = device_name() if self.on_gpu else "cpu"
        # what the checks before each rung read of the card (``admit``); a test emulates
        # another card by setting them
        self.capability = capability() if self.on_gpu else None
        self.triton = triton_present()
        self.memory_cap_gib = memory_cap_gib()
        self.memory_prediction = None      # the running rung's (``admit``), said beside its peak
        peak = peak_for(self.device_name)
        notes = [f"fp32 matmuls {'run as TF32' if self.fp32_label() == 'tf32' else 'stay fp32'} "
                 "(torch.set_float32_matmul_precision('high'))", self._check_flops()]
        if self.memory_cap_gib is not None and self.on_gpu:
            notes.append(apply_memory_cap(self.memory_cap_gib))
        roofs = probe_roofs() if self.on_gpu and probe else None
        if roofs is None:
            notes.append("no measured device ceilings in this run "
                         f"({'no CUDA device to probe' if probe else 'not probed'})")
        self.result = LadderResult(
            framework="torch", device=self.device_name, config=config.to_dict(),
            baseline=self.baseline, versions=versions(), command=command, roofs=roofs,
            peak_tflops=None if peak is None else {"bf16": peak.bf16, "tf32": peak.tf32},
            notes=notes, memory_cap_gib=self.memory_cap_gib)
        compile_cache.listen(lambda line: self.result.notes.append(line))
        self._allow_recompiles()
        self._seeds = itertools.count(config.seed)
        self.memo: dict = {}    # pure functions of (config, batch size): gate batches, references
        self.code = dict(LIBRARY_CODE)
        if not self.on_gpu and config.is_smoke:
            if torch.get_num_threads() > 1:
                # tiny smoke ops: thread synchronisation would cost more than it saves
                torch.set_num_threads(1)
                self.result.notes.append("smoke config on CPU: torch.set_num_threads(1)")
            if fast_cpu_compiles():
                self.result.notes.append("smoke config on CPU: inductor's C++ kernels scalar, not "
                                         "vectorised (perfladder.torch.compiler.fast_cpu_compiles)")

    def _check_flops(self) -> str:
        """The FLOPs-per-token formula every rung's TFLOP/s and MFU use, against
        ``FlopCounterMode`` on the meta device (``perfladder.torch.program.check_flops``),
        once, before any rung: ``CountError`` if they disagree; the line the result keeps."""
        from perfladder.torch.program import check_flops
        T = self.config.num_steps
        self.flop_check = check_flops(self.gpt_config, T, self.flops_per_token)
        return (f"FLOPs per token at T={T} ({self.flops_per_token(T):,}) checked against "
                f"{self.flop_check['counter']} at start: equal")

    def _allow_recompiles(self, limit: int = 64) -> None:
        """Every rung compiles its own configuration of the same ``GPT.forward``: raise dynamo's
        per-code-object limit for a ladder's worth, and make hitting it an error rather than a
        silent fall back to eager."""
        cfg = torch._dynamo.config
        name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        if getattr(cfg, name) < limit:
            setattr(cfg, name, limit)
        for flag in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
            if hasattr(cfg, flag):
                setattr(cfg, flag, True)
                break

    # -- recipes and steps --------------------------------------------------------------------
    def seed_recipe(self) -> Recipe:
        """What R0 runs: eager fp32 (TF32 matmuls on a GPU) at the seed's batch."""
        return Recipe.seed(self.config)

    def recipe_from_dict(self, d: dict) -> Recipe:
        return Recipe.from_dict(d)

    def use(self, **code) -> None:
        """Build this and every later step with these technique functions (by name)."""
        unknown = sorted(set(code) - set(LIBRARY_CODE))
        if unknown:
            raise ValueError(f"no technique named {', '.join(unknown)}; valid choices: "
                             f"{', '.join(LIBRARY_CODE)}")
        bad = [k for k, f in code.items() if not callable(f)]
        if bad:
            raise TypeError(f"technique {bad[0]}={code[bad[0]]!r} must be a function")
        self.code.update(code)

    def make_model(self, recipe: Recipe | None = None, plain_code: bool = False) -> GPT:
        """A fresh GPT from ``config.seed`` (every rung starts from the same weights)."""
        r = recipe or self.seed_recipe()
        code = LIBRARY_CODE if plain_code else self.code
        torch.manual_seed(self.config.seed)
        kw = r.model_kw()
        kw["checkpoint"] = code["checkpoint_block"] if r.checkpoint else False
        return GPT(self.gpt_config, **kw).to(self.device)

    def build_step(self, recipe: Recipe, plain_code: bool = False) -> TrainStep:
        """A fresh model, its AdamW and the training step ``recipe`` describes, built with this
        lab's technique code (``plain_code``: the library's, as every gate's reference is)."""
        if not isinstance(recipe, Recipe):
            raise TypeError(f"recipe must be a perfladder.torch.Recipe, got {type(recipe).__name__}")
        code = LIBRARY_CODE if plain_code else self.code
        model = self.make_model(recipe, plain_code)
        return make_step(model, code["make_optimizer"](model, self.config.lr, recipe.optimizer),
                         device_type=self.device.type, code=code, **recipe.step_kw())

    def stream(self, batch_size: int, split: str = "train"):
        """A fresh stream of (batch_size, num_steps) batches (each call a new shuffle seed)."""
        return batches(self.data, batch_size, self.device, seed=next(self._seeds), split=split)

    def fp32_label(self) -> str:
        """'tf32' on a GPU with TF32 (compute capability 8.0 on), else 'fp32'."""
        return "tf32" if self.on_gpu and supports_bf16(self.capability) else "fp32"

    # -- what the card can run and hold ----------------------------------------------------
    def admit(self, rung, given) -> None:
        """The engine's check before a rung runs: ``NotSupported`` (bf16 on a card without bf16
        tensor cores), ``NotApplicable`` (Triton kernels it cannot run), ``DoesNotFit`` (its
        predicted memory, ``perfladder.ladder.fit``, over what there is)."""
        self.memory_prediction = None
        # a CUDA-graphed step's peak leaves out the graphs' private pool, which holds its
        # activations (B3 measured 0.35 GiB on the H200 where B1 measured 8.2): never a basis
        measured = [r for r in self.result.rungs if not r.recipe.get("cudagraphs")]
        self.memory_prediction = admit(self, rung, given, basis=measured, must_match=("bf16", "checkpoint"),
                                       room=lambda cap: memory_room(cap) if self.on_gpu else cap)

    @property
    def fixed_bytes(self) -> int:
        """Device bytes that do not grow with the batch: fp32 parameters, their gradients and
        AdamW's two moments (the measured peak holds them too)."""
        return 16 * self.num_params

    def kernels(self, recipe: Recipe) -> list[Kernels]:
        """What ``recipe``'s kernels need of a GPU: torch.compile's (inductor writes Triton on a
        GPU: Triton's own floor, 7.0), our Triton kernels and max-autotune's Triton GEMMs (bf16:
        8.0)."""
        out = []
        if recipe.compiled:
            out.append(Kernels("torch.compile's GPU kernels", (7, 0), "triton", self.triton))
        triton_fused = [f for f in recipe.fused if f not in NOT_TRITON]
        if triton_fused or recipe.autotune:
            what = ", ".join([*triton_fused, *(["max-autotune GEMMs"] if recipe.autotune else [])])
            out.append(Kernels(f"our Triton kernels ({what})", (8, 0), "triton", self.triton))
        return out

    # -- measuring -----------------------------------------------------------------------------
    def reset_memory(self) -> None:
        gc.collect()
        if self.on_gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def measure(self, step, batch_size: int, *, timed: int | None = None, warmup: int | None = None,
                windows: int | None = None) -> Measured:
        """Timed until the windows settle, once more if they did not, with the peak device
        memory of the measurement (``perfladder.ladder.lab.Measured``)."""
        c = self.config
        given = {k: v for k, v in dict(timed=timed, warmup=warmup, windows=windows).items() if v is not None}
        settings = WindowSettings.of(c, batch_size, **given)

        def once():
            self.reset_memory()
            return throughput(step, self.stream(batch_size), settings)

        t, again = measure_settled(once, budget_s=c.timing_budget_s)
        if self.on_gpu:
            note = RESERVED_NOTE
            if self.memory_prediction is not None:
                note += f"; {self.memory_prediction.note()}"
            mem = Memory(int(torch.cuda.max_memory_reserved()), PEAK_RESERVED, note,
                         allocated=int(torch.cuda.max_memory_allocated()))
        else:
            mem = Memory(None, "n/a", "no device memory on CPU")
        return Measured(t, again, mem)

    def profile(self, step, batch_size: int) -> ProfileSummary:
        """Where one step's time goes (``perfladder.torch.profile``, outside any timed window)."""
        from perfladder.torch.profile import profile_step
        return profile_step(step, self.stream(batch_size), steps=2 if self.config.is_smoke else 5)

    def precision(self, recipe: Recipe) -> str:
        """What the matmuls run in: 'bf16', or 'tf32' (fp32 on a GPU), or 'fp32' (CPU)."""
        return "bf16" if recipe.bf16 else self.fp32_label()

    def flops_per_token(self, seq_len: int) -> int:
        g = self.gpt_config
        return flops_per_token(self.num_params, g.num_blks, seq_len, g.num_hiddens)

    def receipt(self, step: TrainStep, recipe: Recipe, arithmetic: dict | None = None) -> Receipt:
        """What the step computed in: the dtypes its last call recorded
        (``TrainStep.forward_backward``) and, when given, ``arithmetic``
        (``perfladder.torch.program.arithmetic``: every matmul's, attention kernel's and loss
        op's operands); ``PrecisionError`` when either is not the recipe's precision. A bf16
        one-hot lookup computes its 2 matmuls (forward, table gradient) in fp32 by design."""
        from perfladder.torch.gates import check_receipt
        claimed = self.precision(recipe)
        expect = "bf16" if recipe.bf16 else "fp32"
        allow = 2 if recipe.bf16 and recipe.embed == "onehot" else 0
        check_receipt(step, expect, arithmetic, allow_fp32_matmuls=allow)
        observed = {"logits": step.receipt["logits"]}
        where = "TrainStep.forward_backward"
        if arithmetic is not None:       # checked above: the rung's matmuls all ran in one dtype
            want = {"bf16": "bfloat16", "fp32": "float32"}[expect]
            observed["matmul_operands"] = want
            if arithmetic.get("attention_operands"):
                observed["attention_operands"] = want
            where += " (and its arithmetic, perfladder.torch.program.arithmetic)"
        return Receipt(claimed=claimed, observed=observed, where=where)

    def free(self, graphs: bool = True) -> None:
        """Hand a finished configuration's device memory back before the next is built: its
        recorded CUDA graphs and their pool (only between configurations), then what the
        collector frees. On CPU there is no device memory to measure."""
        if not self.on_gpu:
            return
        if graphs:
            try:
                from torch._inductor.cudagraph_trees import reset_cudagraph_trees
            except ImportError:      # pragma: no cover - older torch
                reset_cudagraph_trees = None
            if reset_cudagraph_trees is not None:
                reset_cudagraph_trees()
                # dynamo's cached code still points at the graphs just shut down: a later
                # compile of the same forward would replay them; start compiles afresh
                torch._dynamo.reset()
        self.reset_memory()

    # -- after the rungs -------------------------------------------------------------------------
    def kernel_report(self, name: str, recipe: Recipe) -> dict:
        from perfladder.torch.kernels import kernel_breakdown, quiet_kineto
        step = self.build_step(recipe)
        steps = 2 if self.config.is_smoke else 5
        with quiet_kineto():
            kb = kernel_breakdown(step, self.stream(recipe.batch_size), steps=steps, warmup=3, top=12)
        return recorded_report(kb, self.result.roofs, self.gpt_config, recipe,
                               seq=self.config.num_steps, framework="torch")

    def learning_check(self, name: str, recipe: Recipe, watch: Stopwatch | None = None):
        """Train ``recipe`` from a fresh init on the learning split; judged on held-out text by
        the reference model (``perfladder.torch.evaluate``). A failed check is returned, not
        raised: the result records it and the caller decides. ``watch``: seconds per part."""
        from perfladder.measure.learning import LearningError
        from perfladder.torch.evaluate import learning_check
        c = self.config
        with phase(watch, "data"):
            data = TimeMachine(recipe.batch_size, c.num_steps, num_train=c.learn_num_train,
                               num_val=c.num_val)
            stream = batches(data, recipe.batch_size, self.device, seed=c.seed + 1000)
        with phase(watch, "build"):
            step = self.build_step(recipe)
        try:
            check = learning_check(step, stream, data, steps=c.learn_steps, watch=watch)
        except LearningError as e:
            check = e.check
        return check

    def __repr__(self) -> str:
        return f"TorchLab(config={self.config.name!r}, device={self.device_name!r})"
