"""``Ladder``: the state the rungs share, and the helpers every rung (R0.., B1..) uses.

A rung is a small function ``rung(ladder) -> RungResult``. It asks the ladder for a fresh
model / optimizer / step / stream, gates correctness, and hands the step to
``ladder.timed_rung(...)``, which times it with the shared discipline, fills in the
derived numbers (TFLOP/s, MFU, peak memory) and appends the result to ``ladder.result``.
"""
from __future__ import annotations

import gc
import itertools

import torch

from ..config import LadderConfig, expected_num_params, flops_per_token
from ..data import TimeMachine
from ..hardware import achieved_tflops, mfu, peak_for
from ..results import LadderResult, RungResult
from ..timing import Throughput
from .model import GPT
from .steps import TrainStep, make_optimizer, make_step
from .stream import batches
from .timer import device_name, throughput, versions

NOT_ON_CPU_MEM = "peak memory: not applicable on CPU"


class Ladder:
    """Data, device, model factory and the growing ``LadderResult`` (at ``.result``)."""

    def __init__(self, config: LadderConfig, device=None, command: str = ""):
        if not isinstance(config, LadderConfig):
            raise TypeError(f"config must be a LadderConfig, got {type(config).__name__}")
        self.config = config
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(f"device={device!r} is not supported; valid choices: 'cuda', 'cpu'")
        # fp32 matmuls may use TF32 tensor cores on CUDA: the fair fp32 baseline.
        torch.set_float32_matmul_precision("high")
        self.data = TimeMachine(config.batch_size, config.num_steps,
                                num_train=config.num_train, num_val=config.num_val)
        self.gpt_config = config.gpt(vocab_size=len(self.data.vocab))
        self.num_params = expected_num_params(self.gpt_config)
        self.flops_per_token = flops_per_token(self.num_params, self.gpt_config.num_blks,
                                               config.num_steps, self.gpt_config.num_hiddens)
        self.device_name = device_name() if self.on_gpu else "cpu"
        peak = peak_for(self.device_name)
        self.result = LadderResult(
            framework="torch", device=self.device_name, config=config.to_dict(), baseline="R0",
            versions=versions(), command=command,
            peak_tflops=None if peak is None else
            {"bf16": peak.bf16, "tf32": peak.tf32, "measured_bf16": peak.measured_bf16},
            notes=[f"torch.set_float32_matmul_precision('high'): fp32 matmuls "
                   f"{'run as TF32' if self.on_gpu else 'stay fp32 on CPU'}"])
        self.throughputs: dict[str, Throughput] = {}   # every timed run, by rung name
        self.predictions: dict[str, list] = {}         # cost-model predictions written before measuring
        # (rung name, perfladder.torch.beyond.Recipe) of the fastest configuration measured so
        # far; None until a B rung runs (then R3's, until a B rung beats it).
        self.fastest = None
        self.beyond: dict = {}                         # state the B rungs share (references, base profile)
        self._allow_recompiles()
        self._seeds = itertools.count(config.seed)
        if self.device.type == "cpu" and config.is_smoke and torch.get_num_threads() > 1:
            # The smoke model's ops are tiny: splitting each over several threads costs more
            # in synchronisation than it saves (8x slower steps measured on a busy 2-core box).
            torch.set_num_threads(1)
            self.result.notes.append("smoke config on CPU: torch.set_num_threads(1) "
                                     "(tiny ops; thread synchronisation would dominate)")

    def _allow_recompiles(self, limit: int = 64) -> None:
        """Every rung compiles its own configuration of the same ``GPT.forward``, and dynamo keeps
        one cache entry per configuration on that code object. Past ``recompile_limit`` (8 by
        default) dynamo would quietly run the model eagerly; raise the limit for a ladder's worth
        of configurations, and make hitting it an error rather than a silent eager fallback."""
        cfg = torch._dynamo.config
        name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        if getattr(cfg, name) < limit:
            setattr(cfg, name, limit)
        for flag in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
            if hasattr(cfg, flag):
                setattr(cfg, flag, True)
                break
        self.result.notes.append(f"torch._dynamo {name} {getattr(cfg, name)} (one cache entry per "
                                 "rung configuration); hitting it raises instead of running eagerly")

    # -- what we run on ----------------------------------------------------------------------
    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def device_type(self) -> str:
        return self.device.type

    def fp32_precision(self) -> str:
        """The precision label of an fp32 rung: TF32 matmuls on a GPU, plain fp32 on CPU."""
        return "tf32" if self.on_gpu else "fp32"

    @property
    def profile_steps(self) -> int:
        return 2 if self.config.is_smoke else 5

    # -- factories -----------------------------------------------------------------------------
    def make_model(self, checkpoint: bool = False, attn_backend=None, embed: str = "gather") -> GPT:
        """A fresh GPT, initialised from ``config.seed`` (every rung starts from the same weights)."""
        torch.manual_seed(self.config.seed)
        return GPT(self.gpt_config, attn_backend=attn_backend, checkpoint=checkpoint,
                   embed=embed).to(self.device)

    def make_optimizer(self, model, kind: str = "default") -> torch.optim.Optimizer:
        return make_optimizer(model, self.config.lr, kind)

    def fresh_step(self, *, compiled: bool, bf16: bool, checkpoint: bool = False,
                   attn_backend=None, embed: str = "gather", optimizer: str = "default",
                   mode=None) -> TrainStep:
        """A new model + AdamW + step for one rung (``optimizer``: one of ``steps.OPTIMIZERS``,
        ``mode``: a ``torch.compile`` mode, see ``steps.COMPILE_MODES``)."""
        model = self.make_model(checkpoint=checkpoint, attn_backend=attn_backend, embed=embed)
        return make_step(model, self.make_optimizer(model, optimizer), compiled=compiled, bf16=bf16,
                         device_type=self.device_type, mode=mode,
                         compile_optimizer=optimizer == "compiled")

    def stream(self, batch_size: int):
        """A fresh stream of (batch_size, num_steps) batches (each call a new shuffle seed)."""
        return batches(self.data, batch_size, self.device, seed=next(self._seeds))

    # -- measuring -------------------------------------------------------------------------------
    def reset_memory(self) -> None:
        gc.collect()
        if self.on_gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_memory(self) -> int | None:
        return int(torch.cuda.max_memory_allocated()) if self.on_gpu else None

    def measure(self, step, batch_size: int, stream=None,
                timed: int | None = None) -> tuple[Throughput, int | None]:
        """Throughput with the config's warm-up / windows (``timed`` steps per window unless
        given), and the peak memory while it ran."""
        stream = self.stream(batch_size) if stream is None else stream
        self.reset_memory()
        c = self.config
        tput = throughput(step, stream, warmup=c.warmup, timed=c.timed if timed is None else timed,
                          windows=c.windows)
        return tput, self.peak_memory()

    def rung_result(self, name: str, label: str, tput: Throughput, *, batch_size: int, bf16: bool,
                    peak_mem: int | None, kind: str = "rung", notes=(), extra=None) -> RungResult:
        """A ``RungResult`` with TFLOP/s, MFU (None where the device is unknown) and memory."""
        notes = list(notes)
        if peak_mem is None and NOT_ON_CPU_MEM not in notes:
            notes.append(NOT_ON_CPU_MEM)
        rate = tput.tokens_per_s
        return RungResult(
            name=name, label=label, tokens_per_s=rate, windows=list(tput.windows),
            spread=tput.spread, batch_size=batch_size, seq_len=self.config.num_steps,
            precision="bf16" if bf16 else self.fp32_precision(), kind=kind,
            tflops=achieved_tflops(rate, self.flops_per_token),
            mfu=mfu(rate, self.flops_per_token, self.device_name, "bf16" if bf16 else "tf32"),
            peak_mem_bytes=peak_mem, notes=notes,
            extra={"step_time_s": tput.step_time_s, "warmup": tput.warmup,
                   "steps_per_window": tput.steps_per_window, **(extra or {})})

    def timed_rung(self, name: str, label: str, step, *, batch_size: int, bf16: bool,
                   kind: str = "rung", notes=(), extra=None, prev: str | None = None) -> RungResult:
        """Time ``step`` at ``batch_size``, build its ``RungResult`` and add it to the ladder."""
        tput, peak = self.measure(step, batch_size)
        self.throughputs[name] = tput
        res = self.rung_result(name, label, tput, batch_size=batch_size, bf16=bf16,
                               peak_mem=peak, kind=kind, notes=notes, extra=extra)
        return self.add(res, prev=prev)

    def add(self, rung: RungResult, prev: str | None = None) -> RungResult:
        """Append to ``self.result`` (ratios filled by ``LadderResult.add``) and free memory."""
        self.result.add(rung, prev=prev)
        gc.collect()
        if self.on_gpu:
            torch.cuda.empty_cache()
        return rung

    def __repr__(self) -> str:
        return (f"Ladder(config={self.config.name!r}, device={self.device_name!r}, "
                f"rungs={[r.name for r in self.result.rungs]})")
